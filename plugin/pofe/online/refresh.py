"""One refresh of an online run: the prompts of the next steps, sampled, judged, scored, written.

A refresh runs the candidate pipeline's own stages on one window of prompts (`pofe_candidates.
shard_work`: render, sample, dedupe, judge, win rates; `build.build_rows`), so dataset responses,
dedupe, the length policy, abstentions and every judge behave as in `axolotl preprocess`. The
policy scores its own candidates without gradients (SPPO's anchor for the window, RRHF's
log-ratio to pi_0), and the window is written to `<output_dir>/online/refresh-<step>/` before
its first step trains:

    generate.jsonl   the sampled candidates per prompt (a generate shard's rows)
    judge.jsonl      the judge's verdicts (a judge shard's rows)
    rows.jsonl       the rows trained on: prompt, responses, sampled ids, the judge's label,
                     the token ids trained on, the policy's (and pi_0's) summed log-probs of
                     each response
    refresh.json     written last: the window (start step, micro-batches of prompt indices), stats

A resumed run reads the window its checkpoint's step falls in back from these files and
trains on exactly its rows, with the anchors and rewards the killed run computed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pofe.columns import ANCHOR_LOGPS, BASE_LOGPS
from pofe.data.formats import candidate_row
from pofe.files import read_json, read_jsonl, write_atomic, write_jsonl_atomic
from pofe.losses import kl_penalised_rewards
from pofe.methods import MethodSpec
from pofe_candidates.abstentions import AbstentionTally, check_abstentions
from pofe_candidates.build import build_rows
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generate_stage import SHARD_SEED_STRIDE
from pofe_candidates.render import ChatTemplateError
from pofe_candidates.shard_work import generate_shard, judge_shard

FOLDER = "online"
# window stats that add up over ranks; the others are means weighted by each rank's prompts
COUNTS = ("prompts", "prompts_dropped", "candidates")
# rows.jsonl's columns beside a data.jsonl row's: the summed log-probs the policy that sampled
# a window gave its candidates, and pi_0's (with kl_coef)
LOGP, LOGP_BASE = "logp", "logp_base"
# and the token ids the trainer scores: {"prompt_ids": [...], "response_ids": [[...], ...]}
TOKENS = "tokens"


@dataclass(frozen=True)
class Window:
    """The steps one refresh feeds: the first one and the prompts of each micro-batch."""

    start_step: int
    micro_batches: list[list[int]]  # prompt indices, in the order the steps take them

    @property
    def prompts(self) -> list[int]:
        return [p for batch in self.micro_batches for p in batch]


@dataclass
class Refreshed:
    """A window's trainable rows per micro-batch (tokenised, labels final) and its stats."""

    window: Window
    rows: list[list[dict[str, Any]]]
    stats: dict[str, float]


def refresh_starts(output_dir: str | Path) -> list[int]:
    """The first steps of the refreshes in `output_dir`, in order (finished or not)."""
    return sorted(int(p.name.split("-")[1]) for p in (Path(output_dir) / FOLDER).glob("refresh-*"))


def refresh_dir(output_dir: str | Path, start_step: int, rank: int = 0, world: int = 1) -> Path:
    """Where the refresh starting at `start_step` is written (each rank its own, under several)."""
    folder = Path(output_dir) / FOLDER / f"refresh-{start_step:07d}"
    return folder / f"rank-{rank}" if world > 1 else folder


def sample_and_judge(
    window: Window,
    prompt_rows: dict[int, dict],
    *,
    generator,
    judge,
    tokenizer,
    method: MethodSpec,
    generate: GenerateConfig,
    judge_cfg: JudgeConfig,
    candidates: CandidatesConfig,
    timer,
) -> tuple[list[dict], list[dict]]:
    """The window's generate and judge rows (`shard_work`'s), `index` the prompt's. Seeded by
    the window's first step, never a running RNG: a refresh sampled again samples the same."""
    indices = window.prompts
    rows = [prompt_rows[i] for i in indices]
    sampling = dataclasses.replace(generate.sampling(), seed=generate.seed + window.start_step * SHARD_SEED_STRIDE)
    with timer("generate"):
        try:
            generated = generate_shard(
                rows, 0, generator, tokenizer, generate, sampling, "prompt", candidates.truncated
            )
        except ChatTemplateError as e:
            raise ChatTemplateError(e.field, e.message, indices[e.row] if e.row is not None else None) from e
    for g in generated:
        g["index"] = indices[g["index"]]
    columns = [judged_columns(r) for r in rows]
    with timer("judge"):
        judged = judge_shard(generated, judge, method.target, judge_cfg, columns)
    unit = "pairs" if judge_cfg.is_pairwise else "candidates"
    check_abstentions(
        AbstentionTally().plus(judged),
        limit=judge_cfg.max_abstention_rate,
        judge=judge_cfg.function or judge_cfg.type,
        unit=unit,
        final=True,
    )
    return generated, judged


def judged_columns(prompt_row: dict) -> dict:
    """A prompt row's columns besides the prompt: what judges that read columns take."""
    return {c: v for c, v in prompt_row.items() if c != "prompt"}


def trainable_rows(judged: list[dict], method: MethodSpec, candidates: CandidatesConfig, tokenize) -> dict[int, dict]:
    """Prompt index -> its data row (`build.build_rows`' shape) and its token ids (`TOKENS`: the
    prompt's and each response's, as the trainer scores them), for the prompts that keep enough
    candidates and fit the length policy; `tokenize(canonical) -> tokenised row`. The others are
    counted in `window_stats`' prompts_dropped."""
    out = {}
    for r in judged:
        built, _ = build_rows([r], method.name, keep=candidates.keep, min_candidates=candidates.min_candidates)
        if not built:
            continue
        row = built[0]
        tokenized = tokenize(candidate_row(row, r["index"], target=method.target, source="online refresh"))
        if tokenized["keep"]:
            out[r["index"]] = {"data": row, TOKENS: {k: tokenized[k] for k in ("prompt_ids", "response_ids")}}
    return out


def with_scores(row: dict, method: MethodSpec, kl_coef: float, anchor_mix: float = 0.0) -> dict:
    """The trainer's row of a rows.jsonl row: its token ids and label, with the scores folded in:
    an anchored method's anchor is the log-probs of the policy that sampled the window, and with
    `anchor_mix` pi_0's come along (the trainer mixes the two, `pofe.losses.mixed_anchor`); with
    `kl_coef`, the rewards are penalised by the log-ratio to pi_0 (`pofe.losses.kl_penalised_rewards`)."""
    column = method.target.column
    out = {**row[TOKENS], column: row[column]}
    if method.needs_anchor:
        out[ANCHOR_LOGPS] = list(row[LOGP])
        if anchor_mix:
            out[BASE_LOGPS] = list(row[LOGP_BASE])
    if kl_coef:
        shaped = kl_penalised_rewards(
            torch.tensor(row[column], dtype=torch.float64),
            torch.tensor(row[LOGP], dtype=torch.float64),
            torch.tensor(row[LOGP_BASE], dtype=torch.float64),
            kl_coef,
        )
        out[column] = shaped.tolist()
    return out


def write_refresh(
    folder: Path, refreshed: Refreshed, generated: list[dict], judged: list[dict], data_rows: list[dict]
) -> None:
    """Write a refresh; refresh.json last, so a folder without it is redone on resume."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(folder / "generate.jsonl", generated)
    write_jsonl_atomic(folder / "judge.jsonl", judged, allow_nan=True)
    write_jsonl_atomic(folder / "rows.jsonl", data_rows)
    record = {"start_step": refreshed.window.start_step, "micro_batches": refreshed.window.micro_batches}
    write_atomic(folder / "refresh.json", json.dumps({**record, "stats": refreshed.stats}, indent=1) + "\n")


def _refresh_json(folder: Path) -> dict:
    return read_json(folder / "refresh.json", f"Delete {folder}: the resumed run samples the window again")


def read_refresh(folder: Path) -> tuple[Window, list[dict], dict[str, float]] | None:
    """A written refresh: its window, rows.jsonl's rows and its stats; None when not finished."""
    if not (folder / "refresh.json").exists():
        return None
    record = _refresh_json(folder)
    window = Window(record["start_step"], record["micro_batches"])
    return window, read_jsonl(folder / "rows.jsonl"), record["stats"]


@dataclass(frozen=True)
class WrittenRefresh:
    """A finished refresh as its files hold it: the step it fed first, its folders (one per
    rank), its stats merged over the ranks (`merged_stats`)."""

    start_step: int
    folders: list[Path]
    stats: dict[str, float]


def merged_stats(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One refresh's stats over its ranks, as `online/*` logs them: counts summed, the others
    means weighted by each rank's prompts (over the ranks that measured them)."""
    merged = {}
    for key in dict.fromkeys(k for stats in per_rank for k in stats):
        having = [s for s in per_rank if key in s]
        if key in COUNTS:
            merged[key] = sum(s[key] for s in having)
        elif sum(s["prompts"] for s in having):
            merged[key] = sum(s[key] * s["prompts"] for s in having) / sum(s["prompts"] for s in having)
    return merged


def written_refreshes(output_dir: str | Path) -> list[WrittenRefresh]:
    """Every finished refresh of the online training in `output_dir`, in step order (for
    `axolotl pofe report`). A refresh whose refresh.json some rank has not written yet (a
    killed run's last) is left out, as a resumed run redoes it."""
    out = []
    for start in refresh_starts(output_dir):
        folder = refresh_dir(output_dir, start)
        folders = sorted(folder.glob("rank-*")) or [folder]
        if not all((f / "refresh.json").is_file() for f in folders):
            continue
        records = [_refresh_json(f) for f in folders]
        out.append(WrittenRefresh(records[0]["start_step"], folders, merged_stats([r["stats"] for r in records])))
    return out


def window_stats(
    generated: list[dict], judged: list[dict], kept: dict[int, dict], kl: list[float]
) -> dict[str, float]:
    """What `online/*` logs of a window: prompts, candidates, the judge's mean and best-of-k
    reward of the policy's own samples (scalar judges; dataset responses left out: they do not
    move), and the mean sampled log-ratio to pi_0 (when measured)."""
    sampled = []
    for g, r in zip(generated, judged, strict=True):
        policy = {c for c, source in zip(g["candidates"], g["sources"]) if source == "policy"}
        rewards = [x for c, x in zip(r["responses"], r.get("rewards") or []) if c in policy]
        if rewards:
            sampled.append(rewards)
    stats = {
        "prompts": float(len(judged)),
        "prompts_dropped": float(len(judged) - len(kept)),
        "candidates": float(sum(len(r["responses"]) for r in judged)),
    }
    if sampled:
        stats["candidate_reward_mean"] = sum(sum(r) for r in sampled) / sum(len(r) for r in sampled)
        stats["candidate_reward_best"] = sum(max(r) for r in sampled) / len(sampled)
    if kl:
        stats["kl_to_base"] = sum(kl) / len(kl)
    return stats
