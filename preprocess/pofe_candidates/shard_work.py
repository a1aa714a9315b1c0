"""The work of the generate and judge stages on one shard: rows in, shard rows out.

StagePlan: what both stages work from (picklable: a worker process gets one).

generate_shard: render each prompt with the policy's chat template, ask the backend for the
candidates, cut those that run on into a user turn, add the dataset's own responses, drop
truncated (if asked), empty and duplicate candidates.
judge_shard: score the candidates (scalar or pairwise judge), drop abstentions, and turn
scores into the method's target (rewards as they are; win rates for SPPO).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pofe.methods import Target
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig, Sampling
from pofe_candidates.dedupe import dedupe
from pofe_candidates.generators import Generator, finish_reason, sampled_ids
from pofe_candidates.judges import Abstain, PairwiseJudge, PromptCut, ScalarJudge, apply_judge, is_pairwise
from pofe_candidates.render import ChatTemplateError, Rendered, as_messages, render_prompt
from pofe_candidates.token_ids import content_ids, end_of_turn_ids, retokenized_ids
from pofe_candidates.user_turn import UserTurn, cut_user_turns, user_turn
from pofe_candidates.win_rates import scalar_preferences, win_rates

# a generate row's optional words for where its prompt came from (an online refresh's "dataset
# <file>, row <r> (0-based)", its window's index being no file's row): judge errors and the
# abstention tally say it in place of "dataset row <index>"
WHERE = "where"


@dataclass(frozen=True)
class StagePlan:
    """One out_dir's prompts, settings and stage folders (manifests already checked)."""

    rows: list[dict]
    method: str
    # the method's target, carried whole: a worker process may not have imported the module
    # that registered the method
    target: Target
    generate: GenerateConfig
    judge: JudgeConfig
    candidates: CandidatesConfig
    policy_path: str
    prompt_column: str
    gen_dir: Path
    judge_dir: Path


def close_generator(generator: Generator) -> None:
    """Let a backend free what it holds (a model, vLLM's engine processes and their GPU
    memory) before the judge loads; backends without a `close()` hold nothing of note."""
    close = getattr(generator, "close", None)
    if close is not None:
        close()


def free_memory() -> None:
    """Collect what dropped references left (models sit in reference cycles), then hand
    CUDA's cached blocks back so the next model can have them."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def generate_shard(
    rows: list[dict],
    first_index: int,
    generator: Generator,
    tokenizer,
    cfg: GenerateConfig,
    sampling: Sampling,
    prompt_column: str = "prompt",
    truncated: str = "drop",
    shard: Path | str | None = None,
    empty: str = "drop",
) -> list[dict]:
    """Candidates for one shard of prompts (`shard`: its file, named in errors).

    Returns one dict per input row: index, prompt, rendered (the prompt text the backend got),
    prompt_ids (the token ids it was conditioned on: the trainer's), candidates (deduplicated,
    dataset responses first), sources, finish_reasons (per candidate: "stop", "length", or None
    for dataset responses and backends that do not say), candidate_ids (per candidate: the
    sampled ids less the stop token, which training scores; None for dataset responses and
    backends that return none), retokenized_differently (how many of them the chat template's
    text, tokenised again, would not have given), candidate_tokens, counts of truncated / empty /
    duplicate candidates removed and of samples cut where they began a user turn (`user_turn_cut`:
    `user_turn.py`), and `dropped` (a reason, or None). `truncated: drop` removes
    candidates that ended at max_new_tokens (finish reason "length"); `empty: keep` keeps the
    empty ones (end of turn at once), which are otherwise removed and counted.
    """
    rendered = render_shard(rows, tokenizer, cfg, prompt_column, first_index)
    live = [r for r in rendered if r.text is not None]
    gen = generator.generate(live, cfg.num_candidates, sampling) if live else []
    return shard_rows(
        rows, first_index, rendered, gen, generator, tokenizer, cfg, prompt_column, truncated, shard, empty
    )


def render_shard(
    rows: list[dict], tokenizer, cfg: GenerateConfig, prompt_column: str = "prompt", first_index: int = 0
) -> list[Rendered]:
    """Each row's prompt rendered with the policy's chat template (`text` None: dropped, too
    long); the backend samples the live ones (`text` not None), in this order. A template that
    raises names the row (`first_index` + its place here) in its ChatTemplateError."""
    rendered = []
    for i, r in enumerate(rows):
        try:
            rendered.append(
                render_prompt(
                    tokenizer, r[prompt_column], max_prompt_tokens=cfg.max_prompt_tokens, overflow=cfg.prompt_overflow
                )
            )
        except ChatTemplateError as e:
            raise ChatTemplateError(e.field, e.message, first_index + i) from e
    return rendered


def shard_rows(
    rows: list[dict],
    first_index: int,
    rendered: list[Rendered],
    gen: list[list],
    generator: Generator,
    tokenizer,
    cfg: GenerateConfig,
    prompt_column: str = "prompt",
    truncated: str = "drop",
    shard: Path | str | None = None,
    empty: str = "drop",
) -> list[dict]:
    """A shard's rows (as `generate_shard` returns them) from its rendered prompts and `gen`,
    the backend's candidates for the live ones, in order."""
    live = [i for i, r in enumerate(rendered) if r.text is not None]
    if len(gen) != len(live) or any(len(g) != cfg.num_candidates for g in gen):
        raise RuntimeError(
            f"backend {getattr(generator, 'name', generator)!r} returned {[len(g) for g in gen]} candidates for "
            f"{len(live)} prompts (expected {cfg.num_candidates} each)"
        )
    by_row = dict(zip(live, gen))
    for i, texts in by_row.items():
        _check_unicode(texts, generator, first_index + i, shard)
    turn = user_turn(tokenizer)  # once per shard: two renders of the template
    out: list[dict] = []
    for i, (row, r) in enumerate(zip(rows, rendered)):
        # `rendered`: the prompt as the policy saw it (chat template applied), for judges that
        # read that (PairRM, as the SPPO scripts feed it)
        # a prompt cut to fit max_prompt_tokens is the turns kept (`render_prompt`), so its rows train on them
        prompt = row[prompt_column] if r.messages is None else r.messages
        rec: dict[str, Any] = {"index": first_index + i, "prompt": prompt, "rendered": r.text, "prompt_ids": r.ids}
        if r.text is None:
            rec.update(
                candidates=[],
                sources=[],
                finish_reasons=[],
                candidate_ids=[],
                retokenized_differently=0,
                candidate_tokens=[],
                exact_dups=0,
                near_dups=0,
                empty=0,
                sampled=0,
                sampled_empty=0,
                truncated_dropped=0,
                user_turn_cut=0,
                dropped=r.reason,
            )
        else:
            dataset = [
                (text, col)
                for col in cfg.include_dataset_responses
                for text in column_texts(row, col, first_index + i)
            ]
            rec.update(
                _row_candidates(dataset, by_row[i], tokenizer, cfg, truncated, empty, turn),
                truncated=r.truncated,
                dropped=None,
            )
            rec["retokenized_differently"] = _retokenized_differently(tokenizer, row[prompt_column], rec)
        out.append(rec)
    return out


def _row_candidates(
    dataset: list[tuple[str, str]],
    sampled: list,
    tokenizer,
    cfg: GenerateConfig,
    truncated: str,
    empty: str = "drop",
    turn: UserTurn | None = None,
) -> dict[str, Any]:
    """One prompt's candidates (its dataset responses first, then the policy's), the policy's
    cut before a user turn they write (`turn`; counted in `user_turn_cut`), then filtered:
    truncated ones (if asked), empty ones (unless `empty` is "keep"), duplicates; texts, sources,
    finish reasons and sampled ids are filtered together. `sampled` and `sampled_empty` count the
    policy's samples and the empty ones among them (end of turn at once), kept or not
    (`empty_samples_warning`)."""
    ids = [None] * len(dataset) + [
        None if sampled_ids(c) is None else content_ids(sampled_ids(c), finish_reason(c), tokenizer) for c in sampled
    ]
    cols = (
        [t for t, _ in dataset] + [str(c) for c in sampled],
        [s for _, s in dataset] + ["policy"] * len(sampled),
        [None] * len(dataset) + [finish_reason(c) for c in sampled],
        ids,
    )
    user_turn_cut = cut_user_turns(cols[0], cols[2], cols[3], len(dataset), turn, tokenizer) if turn is not None else 0
    n = len(cols[0])
    if truncated == "drop":
        cols = _take(cols, [k for k, f in enumerate(cols[2]) if f != "length"])
    cut, n = n - len(cols[0]), len(cols[0])
    # a policy may answer with end-of-turn at once (trained ones do): nothing to rank, unless the
    # method trains on every sample of the policy (`MethodSpec.empty_candidates`)
    if empty != "keep":
        cols = _take(cols, [k for k, c in enumerate(cols[0]) if c.strip()])
    empty = n - len(cols[0])
    exact = near = 0
    if cfg.dedupe:
        kept, exact, near = dedupe(cols[0])
        cols = _take(cols, kept)
    cands, sources, finish, ids = cols
    return dict(
        candidates=cands,
        sources=sources,
        finish_reasons=finish,
        candidate_ids=ids,
        candidate_tokens=[len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in cands],
        exact_dups=exact,
        near_dups=near,
        empty=empty,
        sampled=len(sampled),
        sampled_empty=sum(not str(c).strip() for c in sampled),
        truncated_dropped=cut,
        user_turn_cut=user_turn_cut,
    )


def _retokenized_differently(tokenizer, prompt, rec: dict) -> int | None:
    """How many candidates with sampled ids training would have scored as other ids had it
    tokenised their text again (None: no chat template, so training cannot run on this
    tokenizer anyway)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = as_messages(prompt)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    end = end_of_turn_ids(tokenizer, messages, text)
    return sum(
        retokenized_ids(tokenizer, messages, text, c) != ids + end
        for c, ids in zip(rec["candidates"], rec["candidate_ids"])
        if ids is not None
    )


def _take(cols: tuple[list, ...], kept: list[int]) -> tuple[list, ...]:
    return tuple([xs[k] for k in kept] for xs in cols)


def _check_unicode(texts: list, generator: Generator, row: int, shard: Path | str | None) -> None:
    """Raise ValueError if a candidate is not valid Unicode (a lone surrogate such as
    "\\ud800", which JSON can carry but UTF-8 cannot): the tokenizer would fail on it with an
    unrelated TypeError. Chosen over dropping the candidate: a server sending such text has a
    broken detokenizer, which dropping would hide (its other candidates may be cut wrong too)."""
    for k, text in enumerate(texts):
        try:
            str(text).encode("utf-8")
        except UnicodeEncodeError as e:
            client = getattr(generator, "client", None)
            source = (
                f"the server at {client.base_url}"
                if client is not None
                else f"the {getattr(generator, 'name', type(generator).__name__)} backend"
            )
            raise ValueError(
                f"{source} returned candidate {k} for dataset row {row}{f' (shard {shard})' if shard else ''} "
                f"with invalid Unicode: {e.reason} at character {e.start} ({str(text)[max(0, e.start - 20) : e.end]!r}). "
                "Text must be valid UTF-8: check the server's tokenizer and version (vLLM sends "
                "U+FFFD for incomplete bytes), then run the stage again; finished shards are kept."
            ) from None


def column_texts(row: dict, col: str, index: int) -> list[str]:
    """A dataset-response column's texts for one row (None: none); raises on a non-text value."""
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


def judge_shard(
    gen_rows: list[dict],
    judge: ScalarJudge | PairwiseJudge,
    target: Target,
    cfg: JudgeConfig,
    columns: list[dict] | None = None,
) -> list[dict]:
    """Score one shard. Abstained candidates are removed (and counted per row).

    Pairwise judges give win rates directly; scalar judges give rewards, and win rates through
    `cfg.preferences` (bradley_terry or hard) when the method's `target` is win rates. Each row
    records `judged` (verdicts asked: candidates, or unordered pairs) and one reason per
    abstention, and `prompts_cut`: candidates scored with their prompt cut to fit the judge.
    `columns`: per gen row, its dataset row's other columns (not the prompt), passed to judges
    that read them (`reads_columns`: TRL-style reward functions take them as kwargs). A gen row's
    `WHERE` is carried to its judged row and named by errors in place of its index.
    """
    live = [r for r in gen_rows if r["dropped"] is None and len(r["candidates"]) > 0]
    live_columns = None
    if columns is not None:
        by_index = {r["index"]: c for r, c in zip(gen_rows, columns, strict=True)}
        live_columns = [by_index[r["index"]] for r in live]
    # generate shards from before `rendered` was recorded lack it: only a judge that reads it needs it
    verdicts = apply_judge(
        judge,
        [r["prompt"] for r in live],
        [r.get("rendered") for r in live],
        [r["candidates"] for r in live],
        columns=live_columns,
        rows=[r.get(WHERE, r["index"]) for r in live],
    )
    out_by_index: dict[int, dict] = {}
    if is_pairwise(judge):
        for r, verdict in zip(live, verdicts, strict=True):
            k = len(r["candidates"])
            out_by_index[r["index"]] = {
                "responses": r["candidates"],
                "response_ids": _candidate_ids(r),
                "rewards": None,
                "win_rates": [_round(x) for x in win_rates(verdict.matrix.to(torch.float64)).tolist()],
                "judged": k * (k - 1) // 2,
                "abstained": verdict.abstained_pairs,
                "abstain_reasons": [_cap(x) for x in verdict.abstain_reasons],
                # pairs whose two orders' P(a beats b) do not sum to about 1 (pairwise.ORDER_SUM_TOLERANCE)
                "orders_off": verdict.orders_off,
                "worst_order_sum": verdict.worst_order_sum,
            }
    else:
        wants_win_rates = target.from_win_rates
        for r, sc in zip(live, verdicts, strict=True):
            keep = [k for k, v in enumerate(sc) if not isinstance(v, Abstain)]
            rewards = [float(sc[k]) for k in keep]
            rec = {
                "responses": [r["candidates"][k] for k in keep],
                "response_ids": [_candidate_ids(r)[k] for k in keep],
                "rewards": rewards,
                "win_rates": None,
                "judged": len(sc),
                "abstained": len(sc) - len(keep),
                "abstain_reasons": [_cap(v.reason) for v in sc if isinstance(v, Abstain)],
                # scored with the prompt's start cut to fit the judge (reward_model.py)
                "prompts_cut": sum(isinstance(sc[k], PromptCut) for k in keep),
            }
            if wants_win_rates and rewards:
                pref = scalar_preferences(
                    torch.tensor(rewards, dtype=torch.float64), cfg.preferences, cfg.preferences_temperature
                )
                w = win_rates(pref).tolist()
                rec["win_rates"] = [_round(x) for x in w]
            out_by_index[r["index"]] = rec
    out = []
    for r in gen_rows:
        rec = {"index": r["index"], "prompt": r["prompt"], "dropped": r["dropped"]}
        if WHERE in r:
            rec[WHERE] = r[WHERE]
        rec.update(out_by_index.get(r["index"], {"responses": [], "rewards": None, "win_rates": None, "abstained": 0}))
        out.append(rec)
    return out


def _candidate_ids(gen_row: dict) -> list[list[int] | None]:
    """A generate row's sampled ids per candidate (shards from before they were kept have none)."""
    return gen_row.get("candidate_ids") or [None] * len(gen_row["candidates"])


def _cap(reason: str) -> str:
    # the whole reason is kept as an example for errors; a traceback-sized one is cut
    return reason[:200]


def _round(x: float) -> float:
    # 12 significant digits: identical across runs and platforms' last-bit float noise.
    return float(f"{x:.12g}")
