"""The build stage: trainer rows and summary.json, from the judged shards alone.

Output rows, one per prompt, with the method's label column (`Target.column`; the labels are
the judge's rewards, or the candidates' win rates when `Target.from_win_rates`):
    rrhf: {"prompt": <as input>, "responses": [str], "rewards": [float]}
    sppo: {"prompt": <as input>, "responses": [str], "win_rates": [float in [0, 1]]}
plus "response_ids" (per response: the sampled ids less the stop token, or None for a
dataset response) when the backend returned ids. The training side takes them as they are
(`pofe.data.formats.candidate_row`) and scores those ids (`pofe_candidates.token_ids`).
summary.json records data.jsonl's sha256, which later stages check it against (`data_problem`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from pofe.files import UnreadableFile, file_sha256, read_json
from pofe.methods import Target, method_spec
from pofe.records.candidates import CandidateLengths, CandidatesSummary, LengthStats
from pofe_candidates.abstentions import AbstentionTally
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.judges.pairwise import ORDER_SUM_TOLERANCE
from pofe_candidates.win_rates import SATURATION_BAND, nan_mean, saturation, win_rate_spread


def build_rows(
    judged: list[dict], method: str, *, keep: str = "all", min_candidates: int = 2
) -> tuple[list[dict], Counter]:
    """Trainer rows from judged rows; returns (rows, Counter of drop reasons).

    keep="best_worst" keeps the highest- and lowest-labelled candidate of each row (the SPPO
    paper's data-budget choice; `pofe.methods.check_candidate_rules` says which methods
    allow it).
    """
    target = method_spec(method).target
    verdicts = _verdict_key(target)
    data: list[dict] = []
    dropped: Counter = Counter()
    for r in judged:
        if r["dropped"] is not None:
            dropped["prompt_too_long" if "max_prompt_tokens" in r["dropped"] else "other"] += 1
            continue
        if r["rewards"] is None and r["abstained"] and r["abstained"] == r["judged"]:
            # a pairwise judge that abstained on every pair: win rates all 1/2 carry no signal
            dropped["all_pairs_abstained"] += 1
            continue
        if len(r["responses"]) < min_candidates:
            dropped["too_few_candidates"] += 1
            continue
        labels = r[verdicts]
        idx = list(range(len(labels)))
        if keep == "best_worst":
            best = max(idx, key=lambda k: (labels[k], -k))
            worst = min(idx, key=lambda k: (labels[k], k))
            if best == worst:  # all tied: any two distinct candidates
                best, worst = 0, len(labels) - 1
            idx = [best, worst]
        row = {
            "prompt": r["prompt"],
            "responses": [r["responses"][k] for k in idx],
            target.column: [labels[k] for k in idx],
        }
        # the sampled ids training scores (judge shards from before they were kept have none)
        ids = r.get("response_ids") or [None] * len(r["responses"])
        if any(ids[k] is not None for k in idx):
            row["response_ids"] = [ids[k] for k in idx]
        data.append(row)
    return data, dropped


def _verdict_key(target: Target) -> str:
    """The judge shard field that holds the target's labels: its win rates, or its rewards."""
    return "win_rates" if target.from_win_rates else "rewards"


def summarise(
    generated: list[dict],
    judged: list[dict],
    data: list[dict],
    dropped: Counter,
    *,
    method: str,
    generate: GenerateConfig,
    judge: JudgeConfig,
    candidates: CandidatesConfig,
    saturation_band: float = SATURATION_BAND,
) -> dict:
    """Counts and statistics, computed from the shards only (resume-proof). Every prompt is
    either a row or a counted drop: rows_in == rows + sum(rows_dropped.values()).

    mean_candidate_reward / mean_best_of_k_reward: the RRHF ceiling (the trained model's reward
    tends towards the best candidate's); only for scalar judges.
    mean_win_rate_spread: mean over rows of max - min win rate (`win_rate_spread`): near 0, SPPO's
    targets eta (w - 1/2) carry no signal (e.g. a verifier under unit-scale Bradley-Terry).
    mean_policy_sample_reward: over the policy's own samples alone (not a dataset's responses).
    saturation: the judged prompts' K win rates (all of them, before `candidates.keep`) against
    `saturation_band` (`pofe_candidates.win_rates.saturation`); None for methods on rewards.
    The fields are `pofe.records.candidates.CandidatesSummary`'s, less the pipeline's own
    (data_sha256, truncated_candidates_dropped, the last run's facts).
    """
    live = [g for g in generated if g["dropped"] is None]
    rewards = [r["rewards"] for r in judged if r.get("rewards")]
    tokens = [t for g in live for t in g["candidate_tokens"]]
    chars = [len(c) for g in live for c in g["candidates"]]
    abstentions = AbstentionTally().plus(judged)
    by_source: Counter = Counter(s for g in live for s in g["sources"])
    k = [len(d["responses"]) for d in data]
    target = method_spec(method).target
    trains_on_win_rates = target.from_win_rates
    return {
        "format": CandidatesSummary.FORMAT,
        "method": method,
        "rows_in": len(generated),
        "rows": len(data),
        "rows_dropped": dict(dropped),
        "prompts_truncated": sum(1 for g in live if g.get("truncated")),
        "candidates_per_prompt": {"mean": nan_mean(k), "min": min(k, default=0), "max": max(k, default=0)},
        "candidates_by_source": dict(by_source),
        "duplicates_removed": {
            "exact": sum(g["exact_dups"] for g in generated),
            "near": sum(g["near_dups"] for g in generated),
        },
        "empty_candidates_removed": sum(g.get("empty", 0) for g in generated),
        # the policy's samples cut where they began a user turn of their own (user_turn.py), kept
        "candidates_cut_at_user_turn": sum(g.get("user_turn_cut", 0) for g in generated),
        "mean_candidate_reward": nan_mean([x for rs in rewards for x in rs]),
        "mean_best_of_k_reward": nan_mean([max(rs) for rs in rewards]),
        "mean_policy_sample_reward": nan_mean(policy_sample_rewards(generated, judged)),
        "mean_candidate_tokens": nan_mean(tokens),
        "lengths": candidate_lengths(live, judged, _verdict_key(target)),
        # policy candidates trained on their sampled ids, those the backend gave none for (trained
        # on their text, tokenised again), and how many of the first the text would have changed
        "candidates_with_sampled_ids": _sampled(live, True),
        "candidates_without_sampled_ids": _sampled(live, False),
        "candidates_retokenized_differently": sum(g.get("retokenized_differently") or 0 for g in live),
        "mean_candidate_chars": nan_mean(chars),
        "mean_best_win_rate": nan_mean([max(d[target.column]) for d in data]) if trains_on_win_rates else None,
        "mean_win_rate_spread": nan_mean([_spread(d[target.column]) for d in data]) if trains_on_win_rates else None,
        "saturation": saturation(_judged_win_rates(judged), saturation_band) if trains_on_win_rates else None,
        "judge_verdicts": abstentions.verdicts,
        "judge_abstentions": abstentions.abstained,
        "judge_abstention_reasons": dict(abstentions.reasons),
        "judge_abstention_rate": abstentions.rate,
        # candidates scored with the start of their prompt cut off to fit judge.max_length, and
        # their rows; a response too long on its own is an abstention (judge_abstention_reasons)
        "judge_prompts_cut": sum(r.get("prompts_cut", 0) for r in judged),
        "judge_rows_with_prompt_cut": sum(1 for r in judged if r.get("prompts_cut")),
        "rows_with_equal_labels": sum(1 for d in data if len(set(d[target.column])) == 1),
        # pairwise judges: pairs whose two orders' P(a beats b) sum further than
        # judges.pairwise.ORDER_SUM_TOLERANCE from 1, and the worst sum with its row
        "judge_pairs_order_sum_off": sum(r.get("orders_off") or 0 for r in judged),
        "judge_worst_order_sum": _worst_order_sum(judged),
        "generate": generate.public_dict(),
        "judge": judge.model_dump(),
        "pipeline": candidates.model_dump(),
    }


def policy_sample_rewards(generated: list[dict], judged: list[dict]) -> list[float]:
    """The rewards of the policy's own samples (source "policy": not a dataset's responses) over
    the judged rows that have rewards."""
    sources = {g["index"]: dict(zip(g["candidates"], g["sources"])) for g in generated if g["dropped"] is None}
    return [
        x
        for r in judged
        if r.get("rewards")
        for response, x in zip(r["responses"], r["rewards"])
        if sources.get(r["index"], {}).get(response) == "policy"
    ]


def candidate_lengths(live: list[dict], judged: list[dict], label_key: str) -> CandidateLengths | None:
    """The lengths in tokens (the generate rows' `candidate_tokens`: the policy's tokenizer on the
    text, no end-of-turn token) of every candidate of the `live` generate rows, and of each judged
    prompt's best and worst by its `label_key` labels: the highest and the lowest, each the first
    of equals, as `keep: best_worst` keeps them. A prompt whose labels all tie has neither. None
    without a candidate."""
    every = [t for g in live for t in g["candidate_tokens"]]
    if not every:
        return None
    tokens = {g["index"]: dict(zip(g["candidates"], g["candidate_tokens"])) for g in live}
    best, worst = [], []
    for row in judged:
        labels, responses = row.get(label_key), row.get("responses") or []
        if not labels or row["index"] not in tokens:
            continue
        hi = max(range(len(labels)), key=lambda k: (labels[k], -k))
        lo = min(range(len(labels)), key=lambda k: (labels[k], k))
        if hi != lo:
            best.append(tokens[row["index"]][responses[hi]])
            worst.append(tokens[row["index"]][responses[lo]])
    return CandidateLengths(candidates=LengthStats.of(every), best=LengthStats.of(best), worst=LengthStats.of(worst))


def order_sum_warning(summary: dict, judge_type: str, where) -> str:
    """The warning for a summary's pairs whose two orders do not sum to about 1."""
    worst = summary["judge_worst_order_sum"]
    return (
        f"POFE: {summary['judge_pairs_order_sum_off']} pairs judged by {judge_type} have P(a beats b) + P(b beats a) "
        f"further than {ORDER_SUM_TOLERANCE} from 1 (worst {worst['sum']:g}, prompt row {worst['row']}); both "
        "orders are averaged, which cancels a position bias, but a judge this far off reads the order more than "
        f"the texts; counts in {where}"
    )


def empty_samples_warning(generated: list[dict], where: str, samples: Path) -> str | None:
    """The warning for generate rows (`where`: the stage or refresh they are from) some of whose
    prompts the policy answered with its end of turn alone in every sample: how many samples were
    empty of how many, which prompts (their dataset rows, or a row's `WHERE`) and where the samples
    are (`samples`); None when every prompt got some text. Empty samples are removed before judging
    (or kept, for a method that trains on every sample), so without this a policy that has
    stopped writing is seen only in the candidate counts."""
    silent = [g for g in generated if g.get("sampled") and g.get("sampled_empty") == g["sampled"]]
    if not silent:
        return None
    total, empty = sum(g.get("sampled", 0) for g in generated), sum(g.get("sampled_empty", 0) for g in generated)
    rows = [g.get("where") or f"dataset row {g['index']}" for g in silent]
    named = "; ".join(rows[:5]) + (f"; and {len(rows) - 5} more" if len(rows) > 5 else "")
    return (
        f"POFE: {where}: {empty} of {total} samples were empty (the policy ended its turn at once), and every "
        f"sample of {len(silent)} of {len(generated)} prompts was: {named}. The samples are in {samples}; check "
        "the policy's chat template's generation prompt and its end-of-turn token, or raise "
        "pofe.generate.temperature"
    )


def _worst_order_sum(judged: list[dict]) -> dict | None:
    """The pair sum P(a, b) + P(b, a) furthest from 1 over the judged rows, and its row."""
    sums = [(r["worst_order_sum"], r["index"]) for r in judged if r.get("worst_order_sum") is not None]
    if not sums:
        return None
    value, row = max(sums, key=lambda s: abs(s[0] - 1.0))
    return {"sum": value, "row": row}


def _judged_win_rates(judged: list[dict]) -> list[list[float]]:
    """The win rates of every judged prompt that was not dropped (None for abstained ones)."""
    return [r["win_rates"] for r in judged if r["dropped"] is None and r.get("win_rates")]


def _sampled(live: list[dict], with_ids: bool) -> int:
    """Policy candidates with (or without) sampled ids, over the generate rows."""
    return sum(
        (ids is not None) == with_ids
        for g in live
        for ids, source in zip(g.get("candidate_ids") or [None] * len(g["candidates"]), g["sources"])
        if source == "policy"
    )


def _spread(rates: list[float]) -> float:
    return win_rate_spread(torch.tensor(rates, dtype=torch.float64)).item()


def data_problem(out_dir: Path) -> str | None:
    """Why `out_dir`'s data.jsonl is not the file the pipeline wrote (missing, or its sha256 not
    the one summary.json recorded as it was written: cut short, edited), or None. A later stage
    or a rerun checks it before it trains on, publishes or records the file."""
    out_dir = Path(out_dir)
    data, summary = out_dir / "data.jsonl", out_dir / "summary.json"
    if not data.is_file():
        return f"{data} is missing"
    if not summary.is_file():  # nothing to check against
        return None
    try:
        recorded = read_json(summary, "").get("data_sha256")
    except UnreadableFile as e:
        return str(e).rstrip(". ")
    if recorded is None:  # written by an older POFE: nothing to check against
        return None
    found = file_sha256(data)
    if found != recorded:
        return (
            f"{data} has sha256 {found[:12]}..., not the {recorded[:12]}... it was written with (cut short or edited)"
        )
    return None
