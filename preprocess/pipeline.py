"""Candidates from prompts: generate -> judge -> build, resumable shard by shard.

    result = run_pipeline(rows, method="rrhf", generate=GenerateConfig(...),
                          judge=JudgeConfig(...), candidates=PipelineConfig(out_dir="cands"),
                          policy_path="path/to/policy")

Layout of `out_dir`:
    generate/manifest.json       prompts and generate settings (a restart must match them)
    generate/shard-NNNNN.jsonl   candidates per prompt (after dedupe), finish reasons, lengths, drop reasons
    judge/manifest.json          judge settings and method (manifest.py)
    judge/shard-NNNNN.jsonl      kept responses with rewards and/or win rates, abstentions
    judge-<key>/                 an earlier judge's shards (a judge change reuses generate/)
    data.jsonl                   the trainers' input rows, in prompt order (build.py)
    summary.json                 counts and statistics (see `build.summarise`)

Every shard is written atomically (pofe.files) and verified when a restart reads it back
(shards.py): a damaged one is redone and counted. A run killed at any point and started again
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
import logging
import math
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, Sequence

from pofe.files import write_atomic, write_jsonl_atomic
from pofe.logs import logger_name
from pofe.methods import MethodName, check_candidate_rules, method_spec

from .abstentions import AbstentionTally, check_abstentions
from .build import build_rows, summarise
from .config import FUNCTION_JUDGES, GenerateConfig, JudgeConfig, PipelineConfig
from .generators import Generator, make_generator
from .generators.hf import load_tokenizer
from .judges import PairwiseJudge, ScalarJudge, make_judge
from .manifest import check_manifest, generate_manifest, judge_manifest, select_judge_dir
from .shards import check_generate_shard, check_judge_shard, clean_tmp, read_shard, read_verified, shard_path
from .stages import column_texts, generate_shard, judge_shard

LOG = logging.getLogger(logger_name(__name__))
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
    tokenizer=None,
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
            across calls); built from the configs when None, and only if a shard needs them
            (but a python judge is loaded at once: a bad judge.function fails before generating).
        stop_after: run the stages up to this one only (their shards stay for a later run);
            then nothing is built and None is returned.
        tokenizer: what prompts are rendered with (and the transformers backend decodes with);
            None: policy_path's own (AutoTokenizer). Inside axolotl it is the training one
            (axolotl's load_tokenizer: the recipe's chat_template and its settings).
    Returns:
        PipelineResult with data.jsonl's path, summary.json's path, the row count and summary.
    """
    check_candidate_rules(
        method, pairwise_judge=judge.type if judge.is_pairwise else None, keep=candidates.keep
    )
    if candidates.out_dir is None:
        raise ValueError("run_pipeline needs candidates.out_dir (PipelineConfig(out_dir=...))")
    generate = generate.for_method(method)  # dedupe: the method's default unless set
    candidates = candidates.for_method(method)  # truncated: the method's default unless set
    rows = list(prompts_rows)
    _check_inputs(rows, prompt_column, generate, candidates)
    if judge_impl is None and judge.type in FUNCTION_JUDGES:
        judge_impl = make_judge(judge)  # imports judge.function now, not after generating
    out = Path(candidates.out_dir)
    gen_dir = out / "generate"
    gen_dir.mkdir(parents=True, exist_ok=True)
    check_manifest(gen_dir, {
        **generate_manifest(rows, policy_path=policy_path, generate=generate, shard_size=candidates.shard_size,
                            prompt_column=prompt_column),
        "truncated": candidates.truncated,  # the shards hold what this policy kept
    })
    judge_dir = select_judge_dir(out, judge_manifest(method=method, judge=judge))
    for d in (gen_dir, judge_dir):
        clean_tmp(d)
    timings: dict[str, float] = {}
    redone: dict[str, int] = {}

    t0 = time.monotonic()
    generated, generator = _generate_stage(
        rows, gen_dir, generate, candidates, policy_path, prompt_column, generator, redone, tokenizer
    )
    timings["generate_s"] = time.monotonic() - t0
    if stop_after == "generate":
        return None

    t0 = time.monotonic()
    columns = [{c: v for c, v in r.items() if c != prompt_column} for r in rows]  # for reward_funcs' kwargs
    judged, judge_impl = _judge_stage(generated, judge_dir, columns, method, judge, candidates, judge_impl, redone)
    timings["judge_s"] = time.monotonic() - t0
    if stop_after == "judge":
        return None

    # Build data.jsonl and summary.json from the shards alone (as read back from disk), so a
    # resumed run's outputs cannot depend on what happened in memory before the kill.
    judged_rows = [r for shard in judged for r in shard]
    generated_rows = [r for shard in generated for r in shard]
    data, dropped = build_rows(judged_rows, method, keep=candidates.keep, min_candidates=candidates.min_candidates)
    data_path = out / "data.jsonl"
    write_jsonl_atomic(data_path, data)
    summary = summarise(
        generated_rows, judged_rows, data, dropped, method=method, generate=generate, judge=judge, candidates=candidates
    )
    summary["truncated_candidates_dropped"] = sum(g.get("truncated_dropped", 0) for g in generated_rows)
    summary["shards_redone_last_run"] = redone
    summary["timings_last_run"] = {k: round(v, 3) for k, v in timings.items()}
    for name, obj in (("generate_client", generator), ("judge", judge_impl)):
        client = getattr(obj, "client", None)
        if client is not None and hasattr(client, "stats"):
            summary[f"{name}_requests_last_run"] = client.stats.as_dict()
    summary_path = out / "summary.json"
    write_atomic(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    if not data:
        raise ValueError(
            f"none of the {len(rows)} prompts gave a training row (dropped: {dict(dropped)}; "
            f"candidates.min_candidates={candidates.min_candidates}, judge abstentions "
            f"{summary['judge_abstentions']} {summary['judge_abstention_reasons']}); details in {summary_path}"
        )
    if summary["rows_with_equal_labels"]:
        LOG.warning(
            f"POFE: {summary['rows_with_equal_labels']} of {len(data)} rows in {data_path} have all-equal "
            f"{method_spec(method).target}: no pair to rank there (the judge cannot tell the candidates apart)"
        )
    return PipelineResult(data_path, summary_path, len(data), summary)


def _generate_stage(
    rows: list[dict],
    gen_dir: Path,
    cfg: GenerateConfig,
    candidates: PipelineConfig,
    policy_path: str,
    prompt_column: str,
    generator: Generator | None,
    redone: dict[str, int],
    tokenizer,
) -> tuple[list[list[dict]], Generator | None]:
    """Every generate shard's rows, writing the missing (or damaged) ones; and the generator
    used (None if none was needed)."""
    size = candidates.shard_size
    n_shards = math.ceil(len(rows) / size)
    shards = [
        _reuse(gen_dir, s, partial(check_generate_shard, first_index=s * size, planned=_prompts_in([s], size, len(rows))),
               redone)
        for s in range(n_shards)
    ]
    todo = [s for s in range(n_shards) if shards[s] is None]
    built = generator is None
    with _bar(candidates.progress, len(rows), "generate", done=len(rows) - _prompts_in(todo, size, len(rows))) as bar:
        try:
            for s in todo:
                shard_rows = rows[s * size : (s + 1) * size]
                if generator is None:  # loaded only when a shard is missing
                    generator = make_generator(cfg, policy_path, tokenizer, workdir=gen_dir)
                if tokenizer is None:
                    tokenizer = load_tokenizer(policy_path)
                sampling = dataclasses.replace(cfg.sampling(), seed=cfg.seed + s * SHARD_SEED_STRIDE)
                out_rows = generate_shard(
                    shard_rows, s * size, generator, tokenizer, cfg, sampling, prompt_column, candidates.truncated
                )
                write_jsonl_atomic(shard_path(gen_dir, s), out_rows)
                shards[s] = read_shard(shard_path(gen_dir, s))
                bar.update(len(shard_rows))
        finally:
            if built and hasattr(generator, "close"):
                generator.close()  # a served policy's server stops with its stage, done or failed
    return shards, generator


def _judge_stage(
    generated: list[list[dict]],
    judge_dir: Path,
    columns: list[dict],
    method: str,
    cfg: JudgeConfig,
    candidates: PipelineConfig,
    judge_impl: ScalarJudge | PairwiseJudge | None,
    redone: dict[str, int],
) -> tuple[list[list[dict]], ScalarJudge | PairwiseJudge | None]:
    """Every judge shard's rows, writing the missing (or damaged) ones; and the judge used.
    `columns`: each prompt row's other columns, by index. Stops (abstentions.py) when the judge
    gives too little signal."""
    n_rows = len(columns)
    shards = [_reuse(judge_dir, s, partial(check_judge_shard, generated=g), redone) for s, g in enumerate(generated)]
    todo = [s for s, shard in enumerate(shards) if shard is None]
    if todo and judge_impl is None:
        judge_impl = make_judge(cfg)
    unit = "pairs" if cfg.is_pairwise else "candidates"
    check = dict(limit=cfg.max_abstention_rate, judge=cfg.function or cfg.type, unit=unit)
    tally = AbstentionTally().plus([r for shard in shards if shard is not None for r in shard])
    done = n_rows - _prompts_in(todo, candidates.shard_size, n_rows)
    with _bar(candidates.progress, n_rows, "judge", done=done) as bar:
        for s in todo:
            out_rows = judge_shard(generated[s], judge_impl, method, cfg, [columns[r["index"]] for r in generated[s]])
            tally = tally.plus(out_rows)
            check_abstentions(tally, **check, final=False)  # before writing: a fixed judge redoes it
            write_jsonl_atomic(shard_path(judge_dir, s), out_rows)
            shards[s] = read_shard(shard_path(judge_dir, s))
            bar.update(len(generated[s]))
    check_abstentions(tally, **check, final=True)
    return shards, judge_impl


def _reuse(stage_dir: Path, s: int, check, redone: dict[str, int]) -> list[dict] | None:
    """Shard s's rows if it exists and passes `check`; a damaged one is removed and counted
    in `redone` under its stage's name."""
    path = shard_path(stage_dir, s)
    rows, why = read_verified(path, check)
    if why is not None:
        LOG.warning(f"POFE: {path} is damaged ({why}); redoing it")
        redone[stage_dir.name] = redone.get(stage_dir.name, 0) + 1
    return rows


def _check_inputs(rows: list[dict], prompt_column: str, generate: GenerateConfig, candidates: PipelineConfig) -> None:
    """What can be checked before any model loads: columns, and that k can reach min_candidates."""
    if not rows:
        raise ValueError("run_pipeline got no prompt rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or prompt_column not in r:
            cols = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise KeyError(f"prompt row {i} has no {prompt_column!r} column (columns: {cols})")
    for i, r in enumerate(rows):
        missing = [c for c in generate.include_dataset_responses if c not in r]
        if missing:
            raise ValueError(
                f"generate.include_dataset_responses names {missing}, which prompt row {i} does not have "
                f"(columns: {sorted(r)}); a typo?"
            )
        for c in generate.include_dataset_responses:
            column_texts(r, c, i)  # raises on a value that is not text
    if not generate.include_dataset_responses and generate.num_candidates < candidates.min_candidates:
        raise ValueError(
            f"generate.num_candidates={generate.num_candidates} gives at most {generate.num_candidates} candidate(s) "
            f"per prompt, fewer than candidates.min_candidates={candidates.min_candidates}: every row would be "
            "dropped. Raise num_candidates, or add dataset responses (generate.include_dataset_responses)."
        )


def _prompts_in(shards: list[int], shard_size: int, n: int) -> int:
    return sum(min(shard_size, n - s * shard_size) for s in shards)


def _bar(enabled: bool, total: int, desc: str, done: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=f"pofe {desc}", unit="prompt", disable=not enabled, dynamic_ncols=True)


__all__ = ["run_pipeline", "PipelineResult", "SHARD_SEED_STRIDE"]
