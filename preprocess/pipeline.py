"""Candidates from prompts: generate -> judge -> build, resumable shard by shard.

    result = run_pipeline(rows, method="rrhf", generate=GenerateConfig(...),
                          judge=JudgeConfig(...), candidates=PipelineConfig(out_dir="cands"),
                          policy_path="path/to/policy")

Layout of `out_dir`:
    manifest.json            what this directory was built from (a restart must match it)
    generate/shard-NNNNN.jsonl   candidates per prompt (after dedupe), lengths, drop reasons
    judge/shard-NNNNN.jsonl      kept responses with rewards and/or win rates, abstentions
    data.jsonl               the trainers' input rows, in prompt order (build.py)
    summary.json             counts and statistics (see `build.summarise`)

Every shard is written atomically (pofe.files). A run killed at any point and started again
with the same arguments redoes only the missing shards, and its data.jsonl is byte for byte
the one an uninterrupted run writes: generation is seeded per shard (`seed + shard *
SHARD_SEED_STRIDE`), never from a running RNG.

SPPO with a scalar judge: win rates come from Bradley-Terry preferences
P[i, j] = sigmoid(r_i - r_j). This makes preferences transitive by construction (no
A > B > C > A cycles, which only a pairwise judge can express); the win rates then order
candidates exactly as the rewards do.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from pofe.files import write_atomic, write_jsonl_atomic
from pofe.methods import MethodName, check_candidate_rules

from .build import build_rows, summarise
from .config import GenerateConfig, JudgeConfig, PipelineConfig
from .generators import Generator, make_generator
from .generators.hf import load_tokenizer
from .judges import PairwiseJudge, ScalarJudge, make_judge
from .manifest import build_manifest, check_manifest
from .shards import clean_tmp, read_shard, shard_path
from .stages import generate_shard, judge_shard

SHARD_SEED_STRIDE = 1_000_003  # > any shard size: per-prompt seeds never collide across shards


@dataclass(frozen=True)
class PipelineResult:
    data_path: Path
    summary_path: Path
    rows: int
    summary: dict


def run_pipeline(
    prompts_rows: Sequence[dict],
    *,
    method: MethodName,
    generate: GenerateConfig,
    judge: JudgeConfig,
    candidates: PipelineConfig,
    policy_path: str,
    prompt_column: str = "prompt",
    generator: Generator | None = None,
    judge_impl: ScalarJudge | PairwiseJudge | None = None,
    stop_after: Literal["generate", "judge"] | None = None,
) -> PipelineResult | None:
    """Generate, judge and build the candidate dataset; resume from whatever shards exist.

    Args:
        prompts_rows: N dicts, each with `prompt_column` (a string or chat messages) and any
            columns named in generate.include_dataset_responses.
        method: a registered method (pofe.methods); its target column is what rows carry.
        generate / judge / candidates: the `pofe.generate` / `pofe.judge` / `pofe.candidates`
            blocks; candidates.out_dir must be set.
        policy_path: the policy (tokenizer for the chat template; default generation model).
        generator / judge_impl: pre-built backends (tests, or callers that reuse one model
            across calls); built from the configs when None, and only if a shard needs them.
        stop_after: run the stages up to this one only (their shards stay for a later run);
            then nothing is built and None is returned.
    Returns:
        PipelineResult with data.jsonl's path, summary.json's path, the row count and summary.
    """
    check_candidate_rules(
        method, pairwise_judge=judge.type if judge.is_pairwise else None, keep=candidates.keep
    )
    if candidates.out_dir is None:
        raise ValueError("run_pipeline needs candidates.out_dir (PipelineConfig(out_dir=...))")
    out = Path(candidates.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(prompts_rows)
    _check_rows(rows, prompt_column)
    check_manifest(out, build_manifest(
        rows, policy_path=policy_path, method=method, generate=generate, judge=judge,
        candidates=candidates, prompt_column=prompt_column,
    ))
    n_shards = math.ceil(len(rows) / candidates.shard_size)
    gen_dir, judge_dir = out / "generate", out / "judge"
    for d in (gen_dir, judge_dir):
        d.mkdir(exist_ok=True)
        clean_tmp(d)
    timings: dict[str, float] = {}

    t0 = time.monotonic()
    generator = _generate_stage(rows, gen_dir, n_shards, generate, candidates, policy_path, prompt_column, generator)
    timings["generate_s"] = time.monotonic() - t0
    if stop_after == "generate":
        return None

    t0 = time.monotonic()
    judge_impl = _judge_stage(gen_dir, judge_dir, n_shards, len(rows), method, judge, candidates, judge_impl)
    timings["judge_s"] = time.monotonic() - t0
    if stop_after == "judge":
        return None

    # Build data.jsonl and summary.json from the shards alone (so a resumed run's outputs
    # cannot depend on what happened in memory before the kill).
    judged = [r for s in range(n_shards) for r in read_shard(shard_path(judge_dir, s))]
    generated = [r for s in range(n_shards) for r in read_shard(shard_path(gen_dir, s))]
    data, dropped = build_rows(judged, method, keep=candidates.keep, min_candidates=candidates.min_candidates)
    data_path = out / "data.jsonl"
    write_jsonl_atomic(data_path, data)
    summary = summarise(
        generated, judged, data, dropped, method=method, generate=generate, judge=judge, candidates=candidates
    )
    summary["timings_last_run"] = {k: round(v, 3) for k, v in timings.items()}
    for name, obj in (("generate_client", generator), ("judge", judge_impl)):
        client = getattr(obj, "client", None)
        if client is not None and hasattr(client, "stats"):
            summary[f"{name}_requests_last_run"] = client.stats.as_dict()
    summary_path = out / "summary.json"
    write_atomic(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return PipelineResult(data_path, summary_path, len(data), summary)


def _generate_stage(
    rows: list[dict],
    gen_dir: Path,
    n_shards: int,
    cfg: GenerateConfig,
    candidates: PipelineConfig,
    policy_path: str,
    prompt_column: str,
    generator: Generator | None,
) -> Generator | None:
    """Write the missing generate shards; returns the generator used (None if none was needed)."""
    size = candidates.shard_size
    todo = [s for s in range(n_shards) if not shard_path(gen_dir, s).exists()]
    tokenizer = None
    with _bar(candidates.progress, len(rows), "generate", done=len(rows) - _prompts_in(todo, size, len(rows))) as bar:
        for s in todo:
            shard_rows = rows[s * size : (s + 1) * size]
            if tokenizer is None:  # loaded only when a shard is missing
                tokenizer = load_tokenizer(policy_path)
                if generator is None:
                    generator = make_generator(cfg, policy_path)
            sampling = dataclasses.replace(cfg.sampling(), seed=cfg.seed + s * SHARD_SEED_STRIDE)
            out_rows = generate_shard(shard_rows, s * size, generator, tokenizer, cfg, sampling, prompt_column)
            write_jsonl_atomic(shard_path(gen_dir, s), out_rows)
            bar.update(len(shard_rows))
    return generator


def _judge_stage(
    gen_dir: Path,
    judge_dir: Path,
    n_shards: int,
    n_rows: int,
    method: str,
    cfg: JudgeConfig,
    candidates: PipelineConfig,
    judge_impl: ScalarJudge | PairwiseJudge | None,
) -> ScalarJudge | PairwiseJudge | None:
    """Write the missing judge shards; returns the judge used (None if none was needed)."""
    todo = [s for s in range(n_shards) if not shard_path(judge_dir, s).exists()]
    if todo and judge_impl is None:
        judge_impl = make_judge(cfg)
    done = n_rows - _prompts_in(todo, candidates.shard_size, n_rows)
    with _bar(candidates.progress, n_rows, "judge", done=done) as bar:
        for s in todo:
            gen_rows = read_shard(shard_path(gen_dir, s))
            write_jsonl_atomic(shard_path(judge_dir, s), judge_shard(gen_rows, judge_impl, method))
            bar.update(len(gen_rows))
    return judge_impl


def _check_rows(rows: list[dict], prompt_column: str) -> None:
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or prompt_column not in r:
            cols = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise KeyError(f"prompt row {i} has no {prompt_column!r} column (columns: {cols})")


def _prompts_in(shards: list[int], shard_size: int, n: int) -> int:
    return sum(min(shard_size, n - s * shard_size) for s in shards)


def _bar(enabled: bool, total: int, desc: str, done: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=f"pofe {desc}", unit="prompt", disable=not enabled, dynamic_ncols=True)


__all__ = ["run_pipeline", "PipelineResult", "SHARD_SEED_STRIDE"]
