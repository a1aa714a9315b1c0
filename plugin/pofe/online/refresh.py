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
                     (`pofe.online.stats`), refresh_every, and what made the rows
                     (`pofe.online.made_with`: the method, the judge's settings and code or weights,
                     the generate settings, the candidates' filters, kl_coef, the tokenisation)

A resumed run reads the window its checkpoint's step falls in back from these files and
trains on exactly its rows, with the anchors and rewards the killed run computed, once its
recipe is found to make them alike (`made_with`; else it stops, naming what differs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pofe.columns import ANCHOR_LOGPS, PI_0_LOGPS
from pofe.data.formats import candidate_row
from pofe.files import read_jsonl, write_jsonl_atomic
from pofe.losses import kl_penalised_rewards
from pofe.methods import MethodSpec
from pofe.records.refresh import RefreshRecord, refresh_record
from pofe_candidates.abstentions import AbstentionTally, check_abstentions
from pofe_candidates.build import build_rows
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generate_stage import SHARD_SEED_STRIDE
from pofe_candidates.render import ChatTemplateError
from pofe_candidates.shard_work import WHERE, generate_shard, judge_shard

# rows.jsonl's columns beside a data.jsonl row's: the summed log-probs the policy that sampled
# a window gave its candidates, and pi_0's (`pofe.columns.PI_0_LOGPS`, when a refresh scores under pi_0)
LOGP = "logp"
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
    """A window's trainable rows per micro-batch (tokenised, labels final), its stats, and what it
    warns of (said after its console line; nothing for a refresh read back, said when sampled)."""

    window: Window
    rows: list[list[dict[str, Any]]]
    stats: dict[str, float]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RefreshContext:
    """What every window of an online run is sampled and judged with: the policy's sampler (a
    `pofe_candidates` generator), the judge, the tokenizer, the method, the run's `generate`,
    `judge` and `candidates` blocks (resolved for the method), and `timer(stage)`, a context
    manager that times each stage."""

    generator: Any
    judge: Any
    tokenizer: Any
    method: MethodSpec
    generate: GenerateConfig
    judge_cfg: JudgeConfig
    candidates: CandidatesConfig
    timer: Callable[[str], AbstractContextManager]


def sample_window(
    window: Window,
    prompt_rows: dict[int, dict],
    ctx: RefreshContext,
    seed_offset: int = 0,
    sources: dict[int, str] | None = None,
) -> list[dict]:
    """The window's generate rows (`shard_work.generate_shard`'s), `index` the prompt's, empty
    candidates kept or not as the method says. Seeded by the window's first step (plus
    `seed_offset`, for a second sampler), never a running RNG: a refresh sampled again samples
    the same. `sources`: each prompt's file and row (`prompt_source`), which a row's `WHERE`
    carries to the judge's errors."""
    indices = window.prompts
    rows = [prompt_rows[i] for i in indices]
    seed = ctx.generate.seed + window.start_step * SHARD_SEED_STRIDE + seed_offset
    sampling = dataclasses.replace(ctx.generate.sampling(), seed=seed)
    with ctx.timer("generate"):
        try:
            generated = generate_shard(
                rows,
                0,
                ctx.generator,
                ctx.tokenizer,
                ctx.generate,
                sampling,
                "prompt",
                ctx.candidates.truncated,
                empty=ctx.method.empty_candidates,
            )
        except ChatTemplateError as e:
            raise ChatTemplateError(e.field, e.message, indices[e.row] if e.row is not None else None) from e
    for g in generated:
        g["index"] = indices[g["index"]]
        if sources:
            g[WHERE] = sources[g["index"]]
    return generated


def judged_columns(prompt_row: dict) -> dict:
    """A prompt row's columns besides the prompt: what judges that read columns take."""
    return {c: v for c, v in prompt_row.items() if c != "prompt"}


def prompt_columns(window: Window, prompt_rows: dict[int, dict]) -> list[dict]:
    """Each prompt's dataset columns but the prompt, in the window's order (judges that read them)."""
    return [judged_columns(prompt_rows[i]) for i in window.prompts]


def sample_and_judge(
    window: Window, prompt_rows: dict[int, dict], ctx: RefreshContext, sources: dict[int, str] | None = None
) -> tuple[list[dict], list[dict]]:
    """The window's generate and judge rows (`shard_work`'s), `index` the prompt's."""
    generated = sample_window(window, prompt_rows, ctx, sources=sources)
    with ctx.timer("judge"):
        judged = judge_shard(
            generated, ctx.judge, ctx.method.target, ctx.judge_cfg, prompt_columns(window, prompt_rows)
        )
    check_window_abstentions(judged, ctx.judge_cfg)
    return generated, judged


def check_window_abstentions(judged: list[dict], judge_cfg: JudgeConfig) -> None:
    """Stop where the window's abstentions pass `judge.max_abstention_rate` (the window is final:
    no later shard can bring the rate down)."""
    check_abstentions(
        AbstentionTally().plus(judged),
        limit=judge_cfg.max_abstention_rate,
        judge=judge_cfg.function or judge_cfg.type,
        unit="pairs" if judge_cfg.is_pairwise else "candidates",
        final=True,
    )


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
    `anchor_mix` pi_0's come along (the trainer mixes the two, `pofe.losses.mixed_anchor`); a loss
    with its own KL reads pi_0's log-probs (`pi_0_logps`); else, with `kl_coef`, the rewards are
    penalised by the log-ratio to pi_0 (`pofe.losses.kl_penalised_rewards`)."""
    column = method.target.column
    out = {**row[TOKENS], column: row[column]}
    if method.needs_anchor:
        out[ANCHOR_LOGPS] = list(row[LOGP])
        if anchor_mix:
            out[PI_0_LOGPS] = list(row[PI_0_LOGPS])
    if method.kl_in_loss:
        out[PI_0_LOGPS] = list(row[PI_0_LOGPS])
    elif kl_coef:
        shaped = kl_penalised_rewards(
            torch.tensor(row[column], dtype=torch.float64),
            torch.tensor(row[LOGP], dtype=torch.float64),
            torch.tensor(row[PI_0_LOGPS], dtype=torch.float64),
            kl_coef,
        )
        out[column] = shaped.tolist()
    return out


def write_refresh(
    folder: Path,
    refreshed: Refreshed,
    generated: list[dict],
    judged: list[dict],
    data_rows: list[dict],
    *,
    made: dict,
    refresh_every: int,
) -> None:
    """Write a refresh; refresh.json last, so a folder without it is redone on resume. `made`:
    what made its rows (`made_with`)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(folder / "generate.jsonl", generated)
    write_jsonl_atomic(folder / "judge.jsonl", judged, allow_nan=True)
    write_jsonl_atomic(folder / "rows.jsonl", data_rows)
    record = RefreshRecord(
        start_step=refreshed.window.start_step,
        micro_batches=refreshed.window.micro_batches,
        stats=refreshed.stats,
        refresh_every=refresh_every,
        made_with=made,
    )
    record.write(folder / "refresh.json")


def read_refresh(folder: Path) -> tuple[Window, list[dict], dict[str, float]] | None:
    """A written refresh: its window, rows.jsonl's rows and its stats; None when not finished."""
    record = refresh_record(folder)
    if record is None:
        return None
    window = Window(record.start_step, record.micro_batches)
    return window, read_jsonl(folder / "rows.jsonl"), record.stats
