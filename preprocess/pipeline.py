"""Candidates from prompts: generate -> judge -> build, resumable shard by shard.

    result = run_pipeline(rows, policy_path="path/to/policy", method="rrhf",
                          generate=GenerateConfig(...), judge=JudgeConfig(...), out_dir="cands")

Layout of `out_dir`:
    manifest.json            what this directory was built from (a restart must match it)
    generate/shard-NNNNN.jsonl   candidates per prompt (after dedupe), lengths, drop reasons
    judge/shard-NNNNN.jsonl      kept responses with rewards and/or win rates, abstentions
    data.jsonl               the trainers' input rows, in prompt order
    summary.json             counts and statistics (see `summarise`)

Every shard is written atomically (shards.py). A run killed at any point and started again
with the same arguments redoes only the missing shards, and its data.jsonl is byte for byte
the one an uninterrupted run writes: generation is seeded per shard (`seed + shard *
SHARD_SEED_STRIDE`), never from a running RNG.

Output rows (exactly what pofe's trainers read):
    rrhf: {"prompt": <as input>, "responses": [str], "rewards": [float]}
    sppo: {"prompt": <as input>, "responses": [str], "win_rates": [float in [0, 1]]}

SPPO with a scalar judge: win rates come from Bradley-Terry preferences
P[i, j] = sigmoid(r_i - r_j). This makes preferences transitive by construction (no
A > B > C > A cycles, which only a pairwise judge can express); the win rates then order
candidates exactly as the rewards do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from .config import GenerateConfig, JudgeConfig, PipelineConfig, Sampling
from .dedupe import dedupe
from .shards import clean_tmp, read_jsonl, shard_path, write_atomic, write_jsonl_atomic

Method = Literal["rrhf", "sppo"]
SHARD_SEED_STRIDE = 1_000_003  # > any shard size: per-prompt seeds never collide across shards
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class PipelineResult:
    data_path: Path
    summary_path: Path
    rows: int
    summary: dict


class ManifestMismatch(RuntimeError):
    """out_dir holds shards built from different inputs or settings."""


def run_pipeline(
    prompts_rows: Sequence[dict],
    *,
    policy_path: str,
    method: Method,
    generate: GenerateConfig,
    judge: JudgeConfig,
    out_dir: str | Path | None = None,
    pipeline: PipelineConfig | None = None,
    shard_size: int = 64,
    keep: Literal["all", "best_worst"] = "all",
    min_candidates: int = 2,
    prompt_column: str = "prompt",
    progress: bool = True,
    generator=None,
    judge_impl=None,
    stop_after: Literal["generate", "judge"] | None = None,
) -> PipelineResult | None:
    """Generate, judge and build the candidate dataset; resume from whatever shards exist.

    Args:
        prompts_rows: N dicts, each with `prompt_column` (a string or chat messages) and any
            columns named in generate.include_dataset_responses.
        policy_path: the policy (tokenizer for the chat template; default generation model).
        method: rrhf (scalar rewards needed) or sppo (win rates).
        pipeline: a PipelineConfig (the YAML block); when given, its out_dir, shard_size, keep,
            min_candidates and progress replace the keyword arguments of the same names.
        generator / judge_impl: pre-built backends (tests, or callers that reuse one model
            across calls); built from the configs when None, and only if a shard needs them.
        stop_after: run the stages up to this one only (their shards stay for a later run);
            then nothing is built and None is returned.
    Returns:
        PipelineResult with data.jsonl's path, summary.json's path, the row count and summary.
    """
    if pipeline is not None:
        out_dir, shard_size, keep = pipeline.out_dir, pipeline.shard_size, pipeline.keep
        min_candidates, progress = pipeline.min_candidates, pipeline.progress
    if out_dir is None:
        raise ValueError("run_pipeline needs out_dir (or pipeline=PipelineConfig(out_dir=...))")
    if method not in ("rrhf", "sppo"):
        raise ValueError(f"method must be 'rrhf' or 'sppo', got {method!r}")
    if method == "rrhf" and judge.is_pairwise:
        raise ValueError(
            f"judge.type={judge.type} gives pairwise preferences; RRHF needs a scalar reward per "
            "candidate: use python, reward_model or llm (or method sppo)."
        )
    pcfg = PipelineConfig(
        out_dir=str(out_dir), shard_size=shard_size, keep=keep, min_candidates=min_candidates, progress=progress
    )
    if keep == "best_worst" and method != "sppo":
        raise ValueError("keep=best_worst applies to method sppo only")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(prompts_rows)
    _check_rows(rows, prompt_column, generate.include_dataset_responses)
    _check_manifest(out, _manifest(rows, policy_path, method, generate, judge, pcfg, prompt_column))

    n_shards = math.ceil(len(rows) / shard_size)
    gen_dir, judge_dir = out / "generate", out / "judge"
    for d in (gen_dir, judge_dir):
        d.mkdir(exist_ok=True)
        clean_tmp(d)
    timings: dict[str, float] = {}

    # Stage 1: generate (model candidates + dataset responses, deduplicated).
    t0 = time.monotonic()
    todo = [s for s in range(n_shards) if not shard_path(gen_dir, s).exists()]
    state: dict[str, Any] = {"generator": generator, "tokenizer": None}
    with _bar(progress, len(rows), "generate", done=len(rows) - _prompts_in(todo, shard_size, len(rows))) as bar:
        for s in todo:
            shard_rows = rows[s * shard_size : (s + 1) * shard_size]
            if state["tokenizer"] is None:
                from .generators import make_generator
                from .generators.hf import load_tokenizer

                state["tokenizer"] = load_tokenizer(policy_path)
                if state["generator"] is None:
                    state["generator"] = make_generator(generate, policy_path)
            sampling = dataclasses.replace(generate.sampling(), seed=generate.seed + s * SHARD_SEED_STRIDE)
            out_rows = generate_shard(
                shard_rows, s * shard_size, state["generator"], state["tokenizer"], generate, sampling, prompt_column
            )
            write_jsonl_atomic(shard_path(gen_dir, s), out_rows)
            bar.update(len(shard_rows))
    timings["generate_s"] = time.monotonic() - t0
    if stop_after == "generate":
        return None

    # Stage 2: judge.
    t0 = time.monotonic()
    todo = [s for s in range(n_shards) if not shard_path(judge_dir, s).exists()]
    if todo and judge_impl is None:
        from .judges import make_judge

        judge_impl = make_judge(judge)
    with _bar(progress, len(rows), "judge", done=len(rows) - _prompts_in(todo, shard_size, len(rows))) as bar:
        for s in todo:
            gen_rows = read_jsonl(shard_path(gen_dir, s))
            write_jsonl_atomic(shard_path(judge_dir, s), judge_shard(gen_rows, judge_impl, method))
            bar.update(len(gen_rows))
    timings["judge_s"] = time.monotonic() - t0
    if stop_after == "judge":
        return None

    # Stage 3: build data.jsonl and summary.json from the shards alone (so a resumed run's
    # outputs cannot depend on what happened in memory before the kill).
    judged = [r for s in range(n_shards) for r in read_jsonl(shard_path(judge_dir, s))]
    generated = [r for s in range(n_shards) for r in read_jsonl(shard_path(gen_dir, s))]
    data, dropped = build_rows(judged, method, keep=keep, min_candidates=min_candidates)
    data_path = out / "data.jsonl"
    write_jsonl_atomic(data_path, data)
    summary = summarise(generated, judged, data, dropped, method=method, generate=generate, judge=judge, pipeline=pcfg)
    summary["timings_last_run"] = {k: round(v, 3) for k, v in timings.items()}
    for name, obj in (("generate_client", state["generator"]), ("judge", judge_impl)):
        client = getattr(obj, "client", None)
        if client is not None and hasattr(client, "stats"):
            summary[f"{name}_requests_last_run"] = client.stats.as_dict()
    summary_path = out / "summary.json"
    write_atomic(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return PipelineResult(data_path, summary_path, len(data), summary)


# ---- stage 1 -----------------------------------------------------------------------------


def generate_shard(
    rows: list[dict],
    first_index: int,
    generator,
    tokenizer,
    cfg: GenerateConfig,
    sampling: Sampling,
    prompt_column: str = "prompt",
) -> list[dict]:
    """Candidates for one shard of prompts.

    Returns one dict per input row: index, prompt, candidates (deduplicated, dataset responses
    first), sources, candidate_tokens, dup counts, and `dropped` (a reason, or None).
    """
    from .render import render_prompt

    rendered = [
        render_prompt(tokenizer, r[prompt_column], max_prompt_tokens=cfg.max_prompt_tokens, overflow=cfg.prompt_overflow)
        for r in rows
    ]
    live = [i for i, r in enumerate(rendered) if r.text is not None]
    gen = generator.generate([rendered[i].text for i in live], cfg.num_candidates, sampling) if live else []
    if len(gen) != len(live) or any(len(g) != cfg.num_candidates for g in gen):
        raise RuntimeError(
            f"backend {getattr(generator, 'name', generator)!r} returned {[len(g) for g in gen]} candidates for "
            f"{len(live)} prompts (expected {cfg.num_candidates} each)"
        )
    by_row = dict(zip(live, gen))
    out = []
    for i, (row, r) in enumerate(zip(rows, rendered)):
        rec: dict[str, Any] = {"index": first_index + i, "prompt": row[prompt_column]}
        if r.text is None:
            rec.update(candidates=[], sources=[], candidate_tokens=[], exact_dups=0, near_dups=0,
                       empty=0, dropped=r.reason)
            out.append(rec)
            continue
        cands, sources = [], []
        for col in cfg.include_dataset_responses:
            for text in _column_texts(row, col, first_index + i):
                cands.append(text)
                sources.append(col)
        cands += by_row[i]
        sources += ["policy"] * len(by_row[i])
        # a policy may answer with end-of-turn at once (trained ones do): nothing to score
        nonempty = [k for k, c in enumerate(cands) if c.strip()]
        empty = len(cands) - len(nonempty)
        cands, sources = [cands[k] for k in nonempty], [sources[k] for k in nonempty]
        exact = near = 0
        if cfg.dedupe:
            kept, exact, near = dedupe(cands)
            cands, sources = [cands[k] for k in kept], [sources[k] for k in kept]
        rec.update(
            candidates=cands,
            sources=sources,
            candidate_tokens=[len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in cands],
            exact_dups=exact,
            near_dups=near,
            empty=empty,
            truncated=r.truncated,
            dropped=None,
        )
        out.append(rec)
    return out


def _column_texts(row: dict, col: str, index: int) -> list[str]:
    v = row.get(col)
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    raise TypeError(
        f"row {index}, column {col!r} (generate.include_dataset_responses): expected a string or a list of "
        f"strings, got {type(v).__name__}"
    )


# ---- stage 2 -----------------------------------------------------------------------------


def judge_shard(gen_rows: list[dict], judge, method: Method) -> list[dict]:
    """Score one shard. Abstained candidates are removed (and counted per row)."""
    import torch

    from .judges import Abstain, is_pairwise
    from .win_rates import bradley_terry_preferences, win_rates

    live = [r for r in gen_rows if r["dropped"] is None and len(r["candidates"]) > 0]
    out_by_index: dict[int, dict] = {}
    if is_pairwise(judge):
        prefs = judge.preferences([r["prompt"] for r in live], [r["candidates"] for r in live]) if live else []
        for r, verdict in zip(live, prefs, strict=True):
            w = win_rates(verdict.matrix.to(torch.float64)).tolist()
            out_by_index[r["index"]] = {
                "responses": r["candidates"],
                "rewards": None,
                "win_rates": [_round(x) for x in w],
                "abstained": verdict.abstained_pairs,
            }
    else:
        scores = judge.score([r["prompt"] for r in live], [r["candidates"] for r in live]) if live else []
        for r, sc in zip(live, scores, strict=True):
            keep = [k for k, v in enumerate(sc) if not isinstance(v, Abstain)]
            rewards = [float(sc[k]) for k in keep]
            rec = {
                "responses": [r["candidates"][k] for k in keep],
                "rewards": rewards,
                "win_rates": None,
                "abstained": len(sc) - len(keep),
                "abstain_reasons": [v.reason.split(":")[0] for v in sc if isinstance(v, Abstain)],  # one per abstention
            }
            if method == "sppo" and rewards:
                w = win_rates(bradley_terry_preferences(torch.tensor(rewards, dtype=torch.float64))).tolist()
                rec["win_rates"] = [_round(x) for x in w]
            out_by_index[r["index"]] = rec
    out = []
    for r in gen_rows:
        rec = {"index": r["index"], "prompt": r["prompt"], "dropped": r["dropped"]}
        rec.update(out_by_index.get(r["index"], {"responses": [], "rewards": None, "win_rates": None, "abstained": 0}))
        out.append(rec)
    return out


def _round(x: float) -> float:
    # 12 significant digits: identical across runs and platforms' last-bit float noise.
    return float(f"{x:.12g}")


# ---- stage 3 -----------------------------------------------------------------------------


def build_rows(
    judged: list[dict], method: Method, *, keep: str = "all", min_candidates: int = 2
) -> tuple[list[dict], Counter]:
    """Trainer rows from judged rows; returns (rows, Counter of drop reasons)."""
    data: list[dict] = []
    dropped: Counter = Counter()
    for r in judged:
        if r["dropped"] is not None:
            dropped["prompt_too_long" if "max_prompt_tokens" in r["dropped"] else "other"] += 1
            continue
        if len(r["responses"]) < min_candidates:
            dropped["too_few_candidates"] += 1
            continue
        if method == "rrhf":
            data.append({"prompt": r["prompt"], "responses": r["responses"], "rewards": r["rewards"]})
            continue
        responses, w = r["responses"], r["win_rates"]
        if keep == "best_worst":
            best = max(range(len(w)), key=lambda k: (w[k], -k))
            worst = min(range(len(w)), key=lambda k: (w[k], k))
            if best == worst:  # all tied: any two distinct candidates
                best, worst = 0, len(w) - 1
            idx = [best, worst]
            responses, w = [responses[k] for k in idx], [w[k] for k in idx]
        data.append({"prompt": r["prompt"], "responses": responses, "win_rates": w})
    return data, dropped


def summarise(
    generated: list[dict],
    judged: list[dict],
    data: list[dict],
    dropped: Counter,
    *,
    method: Method,
    generate: GenerateConfig,
    judge: JudgeConfig,
    pipeline: PipelineConfig,
) -> dict:
    """Counts and statistics, computed from the shards only (resume-proof).

    mean_candidate_reward / mean_best_of_k_reward: the RRHF ceiling (the trained model's reward
    tends towards the best candidate's); only for scalar judges.
    """
    live = [g for g in generated if g["dropped"] is None]
    rewards = [r["rewards"] for r in judged if r.get("rewards")]
    tokens = [t for g in live for t in g["candidate_tokens"]]
    chars = [len(c) for g in live for c in g["candidates"]]
    abstain_reasons: Counter = Counter()
    for r in judged:
        abstain_reasons.update(r.get("abstain_reasons", []))
    by_source: Counter = Counter(s for g in live for s in g["sources"])
    k = [len(d["responses"]) for d in data]
    return {
        "method": method,
        "rows_in": len(generated),
        "rows": len(data),
        "rows_dropped": dict(dropped),
        "prompts_truncated": sum(1 for g in live if g.get("truncated")),
        "candidates_per_prompt": {"mean": _mean(k), "min": min(k, default=0), "max": max(k, default=0)},
        "candidates_by_source": dict(by_source),
        "duplicates_removed": {
            "exact": sum(g["exact_dups"] for g in generated),
            "near": sum(g["near_dups"] for g in generated),
        },
        "empty_candidates_removed": sum(g.get("empty", 0) for g in generated),
        "mean_candidate_reward": _mean([x for rs in rewards for x in rs]),
        "mean_best_of_k_reward": _mean([max(rs) for rs in rewards]),
        "mean_candidate_tokens": _mean(tokens),
        "mean_candidate_chars": _mean(chars),
        "mean_best_win_rate": _mean([max(d["win_rates"]) for d in data]) if method == "sppo" else None,
        "judge_abstentions": sum(r.get("abstained", 0) for r in judged),
        "judge_abstention_reasons": dict(abstain_reasons),
        "generate": generate.public_dict(),
        "judge": judge.model_dump(),
        "pipeline": pipeline.model_dump(),
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# ---- helpers -----------------------------------------------------------------------------


def _check_rows(rows: list[dict], prompt_column: str, extra: list[str]) -> None:
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or prompt_column not in r:
            cols = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise KeyError(f"prompt row {i} has no {prompt_column!r} column (columns: {cols})")


def _manifest(rows, policy_path, method, generate, judge, pcfg, prompt_column) -> dict:
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps(r, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return {
        "version": MANIFEST_VERSION,
        "method": method,
        "policy_path": str(policy_path),
        "prompts_sha256": digest.hexdigest(),
        "num_prompts": len(rows),
        "prompt_column": prompt_column,
        "generate": generate.model_dump(),
        "judge": judge.model_dump(),
        "shard_size": pcfg.shard_size,
    }


def _check_manifest(out: Path, manifest: dict) -> None:
    path = out / "manifest.json"
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
    if path.exists():
        old = json.loads(path.read_text())
        norm = json.loads(text)
        if old != norm:
            diff = sorted(k for k in set(old) | set(norm) if old.get(k) != norm.get(k))
            raise ManifestMismatch(
                f"{path} was written for different inputs or settings (differs in: {', '.join(diff)}). "
                "Use a new out_dir, or delete this one to start over."
            )
        return
    write_atomic(path, text)


def _prompts_in(shards: list[int], shard_size: int, n: int) -> int:
    return sum(min(shard_size, n - s * shard_size) for s in shards)


def _bar(enabled: bool, total: int, desc: str, done: int = 0):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=f"pofe {desc}", unit="prompt", disable=not enabled, dynamic_ncols=True)


__all__ = ["run_pipeline", "PipelineResult", "generate_shard", "judge_shard", "build_rows", "summarise"]
