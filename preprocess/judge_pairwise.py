"""Pairwise judging in both orders -> one (K, K) preference matrix per prompt.

A pairwise judge reads (prompt, first, second) and returns P(first beats second). Judges
favour a position (usually the first), so every unordered pair {i, j} is judged both as
(i, j) and as (j, i), and the two are combined with `symmetrize_preferences` (SPPO paper,
step 2). Self-pairs are never judged (diagonal 1/2).

Missing verdicts (Abstain): if one order of a pair abstained, the other order alone gives
the estimate; if both did, the pair counts as a tie (1/2) and as one abstained pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .judges import Abstain, JudgeStats
from .render import Prompt
from .win_rates import symmetrize_preferences

PairFn = Callable[[list[tuple[Prompt, str, str]]], list["float | Abstain"]]


@dataclass(frozen=True)
class PairwiseVerdict:
    """matrix: (K, K) float64, P[i, j] = P(y_i beats y_j), P + P.T = 1, diagonal 1/2.
    abstained_pairs: unordered pairs for which neither order gave a verdict."""

    matrix: torch.Tensor
    abstained_pairs: int = 0


def combine_orders(first_wins: torch.Tensor) -> PairwiseVerdict:
    """Both-order combination with abstentions.

    Args:
        first_wins: (K, K), first_wins[i, j] = P(first beats second) with y_i shown first;
            NaN where the judge abstained; the diagonal is ignored.
    """
    k = first_wins.shape[-1]
    fw = first_wins.to(torch.float64).clone()
    off = ~torch.eye(k, dtype=torch.bool)
    nan = torch.isnan(fw) & off
    one_missing = nan & ~nan.T
    # fw[i, j] missing, fw[j, i] present: 1 - fw[j, i] is the single-order estimate.
    fw[one_missing] = (1.0 - fw.T)[one_missing]
    both_missing = nan & nan.T
    fw[both_missing] = 0.5
    fw[~off] = 0.5
    return PairwiseVerdict(symmetrize_preferences(fw), int(both_missing.sum()) // 2)


def ordered_pairs(k: int) -> list[tuple[int, int]]:
    """All (i, j), i != j: K (K - 1) judge calls per prompt."""
    return [(i, j) for i in range(k) for j in range(k) if i != j]


def preferences_both_orders(
    pair_fn: PairFn, prompts: list[Prompt], responses: list[list[str]], stats: JudgeStats
) -> list[PairwiseVerdict]:
    """Judge every ordered pair of every prompt in ONE batched call of pair_fn, map back."""
    jobs: list[tuple[int, int, int]] = []  # (prompt index, i, j)
    items: list[tuple[Prompt, str, str]] = []
    for p, (prompt, cands) in enumerate(zip(prompts, responses, strict=True)):
        for i, j in ordered_pairs(len(cands)):
            jobs.append((p, i, j))
            items.append((prompt, cands[i], cands[j]))
    verdicts = pair_fn(items) if items else []
    stats.count_call(len(items))
    mats = [torch.full((len(c), len(c)), float("nan"), dtype=torch.float64) for c in responses]
    for (p, i, j), v in zip(jobs, verdicts, strict=True):
        if not isinstance(v, Abstain):
            mats[p][i, j] = float(v)
    return [combine_orders(m) for m in mats]
