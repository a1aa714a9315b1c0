"""A refresh for a method that plays the mixture (Nash-MD): each policy sample judged against an opponent.

For each prompt of the window the policy samples its `generate.num_candidates` responses y_i
(through the recipe's backend, as for RRHF and SPPO) and the geometric mixture of the policy
and pi_0 samples as many opponents y'_i (`pofe.online.mixture`, always the training model),
seeded apart from the policy's. Sample i is paired with opponent i (with opponent i mod M when
the length policy left M < i + 1 of them: the pairs stay independent draws of the two
samplers). Empty responses (end of turn at once) are samples like any other, judged and trained
on (`MethodSpec.empty_candidates`): were they dropped, a policy that says nothing would escape
every verdict, which is where the toy's policy went when they were. The judge then gives P(y_i beats y'_i) pair by pair, through the
candidate pipeline's judge stage on two-response rows (`shard_work.judge_shard`), so every judge
behaves as it does offline:

- a pairwise judge (PairRM, a pairwise LLM in both orders, a Python function) gives the pair's
  preference;
- a scalar judge scores y and y' and the preference is `judge.preferences`: bradley_terry,
  sigmoid((r - r') / T), for a reward model's logits; hard, 1 / 1/2 / 0, for a verifier (scores
  in [0, 1] under bradley_terry would squeeze every preference toward 1/2).

The stage returns win rates w = mean_j P[i, j] over the two responses with the self-pair as a
tie, so w_y = (1/2 + P(y beats y')) / 2 and P = 2 w_y - 1/2. A pair with an abstention is left
out (counted); a prompt left with no pair trains on nothing this window (`prompts_dropped`).
Each judge.jsonl row is one prompt: its samples, their opponents, the preferences, and the
rewards of both when the judge is scalar.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pofe.data.formats import candidate_row
from pofe.methods import MethodSpec
from pofe.online.refresh import TOKENS, RefreshContext, Window, check_window_abstentions, prompt_columns, sample_window
from pofe_candidates.generate_stage import SHARD_SEED_STRIDE
from pofe_candidates.shard_work import WHERE, judge_shard

# the opponents' seed, apart from the policy's: the window's seed plus this (below the next
# window's, SHARD_SEED_STRIDE further), so the two samplers never draw from the same stream
OPPONENT_SEED_OFFSET = SHARD_SEED_STRIDE // 2
OPPONENTS = "opponents"


def play_window(
    window: Window,
    prompt_rows: dict[int, dict],
    ctx: RefreshContext,
    opponent,
    sources: dict[int, str] | None = None,
) -> tuple[list[dict], list[dict]]:
    """The window's generate rows (the policy's samples, from `ctx.generator`) and one judged row
    per prompt (its samples, their opponents from `opponent` and the preferences,
    `method.target.column`); `sources` as `sample_window` takes them."""
    generated = sample_window(window, prompt_rows, ctx, sources=sources)
    opposed = sample_window(window, prompt_rows, dataclasses.replace(ctx, generator=opponent), OPPONENT_SEED_OFFSET)
    columns = prompt_columns(window, prompt_rows)
    verdicts: list[list[dict]] = [[] for _ in generated]
    method = ctx.method
    with ctx.timer("judge"):
        for slot in range(ctx.generate.num_candidates):
            live = [p for p, (g, o) in enumerate(zip(generated, opposed)) if _has_pair(g, o, slot)]
            pairs = [_pair_row(generated[p], opposed[p], slot) for p in live]
            if not pairs:
                continue
            judged = judge_shard(pairs, ctx.judge, method.target, ctx.judge_cfg, [columns[p] for p in live])
            for p, verdict in zip(live, judged, strict=True):
                verdicts[p].append(verdict)
    judged = [_prompt_row(g, o, v, method) for g, o, v in zip(generated, opposed, verdicts)]
    check_window_abstentions(judged, ctx.judge_cfg)
    return generated, judged


def _has_pair(generated: dict, opposed: dict, slot: int) -> bool:
    return (
        generated["dropped"] is None
        and opposed["dropped"] is None
        and slot < len(generated["candidates"])
        and bool(opposed["candidates"])
    )


def _ids(row: dict, k: int) -> list[int] | None:
    return (row.get("candidate_ids") or [None] * len(row["candidates"]))[k]


def _pair_row(generated: dict, opposed: dict, slot: int) -> dict:
    """A generate row of two candidates, the policy's sample `slot` and its opponent."""
    j = slot % len(opposed["candidates"])
    return {
        "index": generated["index"],
        "prompt": generated["prompt"],
        "rendered": generated["rendered"],
        "dropped": None,
        "candidates": [generated["candidates"][slot], opposed["candidates"][j]],
        "candidate_ids": [_ids(generated, slot), _ids(opposed, j)],
        **({WHERE: generated[WHERE]} if WHERE in generated else {}),
    }


def _prompt_row(generated: dict, opposed: dict, verdicts: list[dict], method: MethodSpec) -> dict[str, Any]:
    """One prompt's judged row from its pairs' verdicts (judge shard rows of two responses)."""
    row: dict[str, Any] = {
        "index": generated["index"],
        "prompt": generated["prompt"],
        "dropped": generated["dropped"] or opposed["dropped"],
        "responses": [],
        "response_ids": [],
        OPPONENTS: [],
        "opponent_ids": [],
        method.target.column: [],
        "rewards": None,
        "opponent_rewards": None,
        "judged": sum(v.get("judged", 0) for v in verdicts),
        "abstained": sum(v["abstained"] for v in verdicts),
        "abstain_reasons": [reason for v in verdicts for reason in v.get("abstain_reasons", [])],
        # the opponents' samples cut where they began a user turn (the policy's: its generate row's)
        "opponents_cut_at_user_turn": opposed.get("user_turn_cut", 0),
        **({WHERE: generated[WHERE]} if WHERE in generated else {}),
    }
    for v in verdicts:
        # a scalar judge's abstention removes a response; a pairwise one's leaves the pair at 1/2
        if len(v["responses"]) < 2 or (v["rewards"] is None and v["abstained"]):
            continue
        row["responses"].append(v["responses"][0])
        row[OPPONENTS].append(v["responses"][1])
        row["response_ids"].append(v["response_ids"][0])
        row["opponent_ids"].append(v["response_ids"][1])
        row[method.target.column].append(float(f"{2 * v['win_rates'][0] - 0.5:.12g}"))
        if v["rewards"] is not None:
            row["rewards"] = [*(row["rewards"] or []), v["rewards"][0]]
            row["opponent_rewards"] = [*(row["opponent_rewards"] or []), v["rewards"][1]]
    return row


def preference_rows(judged: list[dict], method: MethodSpec, tokenize) -> dict[int, dict]:
    """Prompt index -> its data row (the policy's samples and their preferences, `candidate_row`'s
    input; with the opponents beside them) and its token ids (`TOKENS`), for the prompts with a
    judged pair that fit the length policy; `tokenize(canonical) -> tokenised row`."""
    out = {}
    column = method.target.column
    for r in judged:
        if r["dropped"] is not None or not r["responses"]:
            continue
        row = {"prompt": r["prompt"], "responses": r["responses"], column: r[column]}
        if any(ids is not None for ids in r["response_ids"]):
            row["response_ids"] = r["response_ids"]
        tokenized = tokenize(candidate_row(row, r["index"], target=method.target, source="online refresh"))
        if tokenized["keep"]:
            ids = {k: tokenized[k] for k in ("prompt_ids", "response_ids")}
            out[r["index"]] = {"data": {**row, OPPONENTS: r[OPPONENTS]}, TOKENS: ids}
    return out


def opponent_stats(judged: list[dict], kept: dict[int, dict], method: MethodSpec, mixture_kl: float | None) -> dict:
    """What `online/*` logs of a window beside `window_stats`: the mean preference of the trained
    samples over their opponents, how many pairs there were and how many tied (preference 1/2: no
    push either way), the opponents cut where they began a user turn, the opponents' mean reward
    (scalar judges), and the mixture's mean per-token KL(pi_mix || pi_theta) while it sampled."""
    column = method.target.column
    preferences = [p for i in kept for p in kept[i]["data"][column]]
    opponent_rewards = [x for r in judged for x in r["opponent_rewards"] or []]
    stats = {
        "pairs": float(len(preferences)),
        "pairs_tied": float(sum(p == 0.5 for p in preferences)),
        "opponents_cut_at_user_turn": float(sum(r.get("opponents_cut_at_user_turn", 0) for r in judged)),
    }
    if preferences:
        stats["preference"] = sum(preferences) / len(preferences)
    if opponent_rewards:
        stats["opponent_reward_mean"] = sum(opponent_rewards) / len(opponent_rewards)
    if mixture_kl is not None:
        stats["mixture_kl"] = mixture_kl
    return stats
