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
    refresh.json     written last: the window (start step, micro-batches of prompt indices), stats,
                     refresh_every, and what made the rows (`made_with`: the method, the judge's
                     settings and code or weights, the generate settings, the candidates' filters,
                     kl_coef, the tokenisation)

A resumed run reads the window its checkpoint's step falls in back from these files and
trains on exactly its rows, with the anchors and rewards the killed run computed, once its
recipe is found to make them alike (`made_with`; else it stops, naming what differs).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pofe.args import PofeConfig
from pofe.columns import ANCHOR_LOGPS, BASE_LOGPS
from pofe.data.formats import candidate_row
from pofe.files import read_json, read_jsonl, write_atomic, write_jsonl_atomic
from pofe.losses import kl_penalised_rewards
from pofe.methods import MethodSpec
from pofe_candidates.abstentions import AbstentionTally, check_abstentions
from pofe_candidates.build import build_rows
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generate_stage import SHARD_SEED_STRIDE
from pofe_candidates.manifest import changed_settings, generate_settings, judge_manifest, recorded
from pofe_candidates.render import ChatTemplateError
from pofe_candidates.shard_work import generate_shard, judge_shard

FOLDER = "online"
# window stats that add up over ranks; the others are means weighted by each rank's prompts
COUNTS = (
    "prompts",
    "prompts_dropped",
    "candidates",
    "candidates_empty",
    "candidates_duplicate",
    "candidates_truncated",
    "judge_verdicts",
    "judge_abstentions",
)
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


def made_with(pofe: PofeConfig, sequence_len: int) -> dict:
    """What a refresh's rows depend on besides its window and the policy that sampled it, as
    refresh.json records it (redacted: a served policy's command may carry its --api-key): the
    method, the judge (`judge_manifest`: its settings and its code or weights), the generate
    settings, the candidates' filters, kl_coef (RRHF's rewards use pi_0's log-probs, written
    only with it), the opponents' mixture (`pofe.nash_md`) and the tokenisation of the rows
    trained on."""
    judge = judge_manifest(method=pofe.method, judge=pofe.judge)
    candidates = pofe.candidates.for_method(pofe.method)
    return recorded(
        {
            "method": pofe.method,
            "judge": judge["judge"],
            "judge_identity": judge["judge_identity"],
            "generate": generate_settings(pofe.generate),
            "candidates": candidates.model_dump(include={"keep", "min_candidates", "truncated"}),
            "kl_coef": pofe.online.kl_coef,
            # the opponents' mixture (Nash-MD): another mixture_coef samples other opponents
            "nash_md": pofe.nash_md.model_dump() if pofe.nash_md else None,
            "tokenize": {
                "sequence_len": sequence_len,
                "max_prompt_len": pofe.max_prompt_len or sequence_len // 2,
                "truncation": pofe.truncation,
            },
        }
    )


def sample_window(
    window: Window,
    prompt_rows: dict[int, dict],
    generator,
    tokenizer,
    generate: GenerateConfig,
    candidates: CandidatesConfig,
    timer,
    method: MethodSpec,
    seed_offset: int = 0,
) -> list[dict]:
    """The window's generate rows (`shard_work.generate_shard`'s), `index` the prompt's, empty
    candidates kept or not as `method` says. Seeded by the window's first step (plus
    `seed_offset`, for a second sampler), never a running RNG: a refresh sampled again samples
    the same."""
    indices = window.prompts
    rows = [prompt_rows[i] for i in indices]
    seed = generate.seed + window.start_step * SHARD_SEED_STRIDE + seed_offset
    sampling = dataclasses.replace(generate.sampling(), seed=seed)
    with timer("generate"):
        try:
            generated = generate_shard(
                rows,
                0,
                generator,
                tokenizer,
                generate,
                sampling,
                "prompt",
                candidates.truncated,
                empty=method.empty_candidates,
            )
        except ChatTemplateError as e:
            raise ChatTemplateError(e.field, e.message, indices[e.row] if e.row is not None else None) from e
    for g in generated:
        g["index"] = indices[g["index"]]
    return generated


def prompt_columns(window: Window, prompt_rows: dict[int, dict]) -> list[dict]:
    """Each prompt's dataset columns but the prompt, in the window's order (judges that read them)."""
    return [{c: v for c, v in prompt_rows[i].items() if c != "prompt"} for i in window.prompts]


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
    """The window's generate and judge rows (`shard_work`'s), `index` the prompt's."""
    generated = sample_window(window, prompt_rows, generator, tokenizer, generate, candidates, timer, method)
    with timer("judge"):
        judged = judge_shard(generated, judge, method.target, judge_cfg, prompt_columns(window, prompt_rows))
    unit = "pairs" if judge_cfg.is_pairwise else "candidates"
    check_abstentions(
        AbstentionTally().plus(judged),
        limit=judge_cfg.max_abstention_rate,
        judge=judge_cfg.function or judge_cfg.type,
        unit=unit,
        final=True,
    )
    return generated, judged


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


def with_scores(row: dict, method: MethodSpec, kl_coef: float) -> dict:
    """The trainer's row of a rows.jsonl row: its token ids and label, with the scores folded in:
    an anchored method's anchor is the log-probs of the policy that sampled the window; a loss
    with its own KL reads pi_0's log-probs (`base_logps`); else, with `kl_coef`, the rewards are
    penalised by the log-ratio to pi_0 (`pofe.losses.kl_penalised_rewards`)."""
    column = method.target.column
    out = {**row[TOKENS], column: row[column]}
    if method.needs_anchor:
        out[ANCHOR_LOGPS] = list(row[LOGP])
    if method.kl_in_loss:
        out[BASE_LOGPS] = list(row[LOGP_BASE])
    elif kl_coef:
        shaped = kl_penalised_rewards(
            torch.tensor(row[column], dtype=torch.float64),
            torch.tensor(row[LOGP], dtype=torch.float64),
            torch.tensor(row[LOGP_BASE], dtype=torch.float64),
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
    record = {
        "start_step": refreshed.window.start_step,
        "micro_batches": refreshed.window.micro_batches,
        "stats": refreshed.stats,
        "refresh_every": refresh_every,
        "made_with": made,
    }
    write_atomic(folder / "refresh.json", json.dumps(record, indent=1) + "\n")


def _refresh_json(folder: Path) -> dict:
    return read_json(folder / "refresh.json", f"Delete {folder}: the resumed run samples the window again")


def refresh_record(folder: Path) -> dict | None:
    """A finished refresh's refresh.json (window, stats, refresh_every, made_with); None when
    not finished."""
    return _refresh_json(folder) if (folder / "refresh.json").exists() else None


IDENTITY = "judge_identity."


def setting_changes(recorded_with: dict | None, made: dict) -> str:
    """How a refresh's `made_with` differs from `made`, this recipe's: "key: then, now; ...". A
    judge function's or model's digest is said only when its code or weights changed under the
    same name (another function or model is said by its own key)."""
    if recorded_with is None:
        return "its refresh.json records nothing of what made it (an older POFE wrote it)"
    said = []
    for key, then, now in changed_settings(recorded_with, made):
        if not key.startswith(IDENTITY):
            said.append(f"{key}: {then} then, {now} now")
        elif "unset" not in (then, now):
            was, now = (json.loads(digest)[:12] for digest in (then, now))
            said.append(f"the code or weights of {key[len(IDENTITY) :]} (sha256 {was} then, {now} now)")
    return "; ".join(said)


def read_refresh(folder: Path) -> tuple[Window, list[dict], dict[str, float]] | None:
    """A written refresh: its window, rows.jsonl's rows and its stats; None when not finished."""
    record = refresh_record(folder)
    if record is None:
        return None
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
    move), and the mean sampled log-ratio to pi_0 (when measured); and what removed candidates
    before training: empty, duplicate and cut ones (generation), the judge's abstentions (of its
    verdicts: candidates, or pairs for a pairwise judge)."""
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
        "candidates_empty": float(sum(g.get("empty", 0) for g in generated)),
        "candidates_duplicate": float(sum(g.get("exact_dups", 0) + g.get("near_dups", 0) for g in generated)),
        "candidates_truncated": float(sum(g.get("truncated_dropped", 0) for g in generated)),
        "judge_verdicts": float(sum(r.get("judged", 0) for r in judged)),
        "judge_abstentions": float(sum(r.get("abstained", 0) for r in judged)),
    }
    if sampled:
        stats["candidate_reward_mean"] = sum(sum(r) for r in sampled) / sum(len(r) for r in sampled)
        stats["candidate_reward_best"] = sum(max(r) for r in sampled) / len(sampled)
    if kl:
        stats["kl_to_base"] = sum(kl) / len(kl)
    return stats


def dropped_candidates(stats: dict[str, float], folder: Path) -> str:
    """Why a window's prompts kept too few candidates, from its stats (`window_stats`), and what
    to do: for a micro-batch left with none to train on."""
    counts = {
        "empty (the policy ended its turn at once)": stats.get("candidates_empty", 0),
        "duplicates (generate.dedupe)": stats.get("candidates_duplicate", 0),
        "cut at max_new_tokens (candidates.truncated: drop)": stats.get("candidates_truncated", 0),
    }
    removed = ", ".join(f"{int(n)} {what}" for what, n in counts.items())
    said = (
        f"Of this window's {int(stats['prompts'])} prompts, {int(stats['prompts_dropped'])} kept too few: its "
        f"candidates removed were {removed}, and the judge abstained on {int(stats.get('judge_abstentions', 0))} of "
        f"{int(stats.get('judge_verdicts', 0))} verdicts; the length policy drops the rest (the samples are in "
        f"{folder / 'generate.jsonl'}). "
    )
    if max(counts.values()) == counts["empty (the policy ended its turn at once)"] > 0:
        return said + (
            "The policy mostly answers with its end-of-turn token alone: check its samples and its chat template's "
            "generation prompt, raise pofe.generate.temperature, or add dataset responses "
            "(generate.include_dataset_responses)"
        )
    return said + (
        "Raise pofe.generate.num_candidates or temperature, micro_batch_size, or add dataset responses "
        "(generate.include_dataset_responses)"
    )
