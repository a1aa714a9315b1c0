"""Tournament maths of the evaluation: model-vs-model win rates and their cycles.

W[a, b] = P(a's response beats b's), averaged over prompts and over all sample pairs.
Scalar judges give W through Bradley-Terry on the rewards, sigmoid(r_a - r_b); pairwise
judges give it directly, from the judge's preference matrix over all models' responses.

Cycles: "a beats b" means W[a, b] > threshold (0.5 by default; `pofe.eval.cycle_threshold`
raises it to ignore noise). `find_cycles` lists every 3-cycle a > b > c > a. A tournament
(every pair decided) is intransitive iff it holds a 3-cycle, so 3-cycles are enough to
flag any cycle there.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from pofe.preprocess.win_rates import bradley_terry_preferences


def block_win_matrix(pref: Tensor, num_models: int, num_samples: int) -> Tensor:
    """Average a preference matrix over all responses into a model-vs-model matrix.

    Args:
        pref: (P, M*S, M*S), pref[p, i, j] = P(response i beats response j) for prompt p;
            responses are ordered model-major (model m's samples are m*S .. m*S+S-1).
            NaN entries (abstentions) are left out of the averages.
    Returns:
        (M, M): W[a, b] = mean over prompts and sample pairs of P(a's beats b's);
        the diagonal is exactly 1/2.
    """
    w = torch.nanmean(per_prompt_win_matrix(pref, num_models, num_samples), dim=0)  # (M, M)
    w.fill_diagonal_(0.5)
    return w


def per_prompt_win_matrix(pref: Tensor, num_models: int, num_samples: int) -> Tensor:
    """(P, M*S, M*S) response preferences (as `block_win_matrix`) -> (P, M, M): on each
    prompt, the mean over sample pairs of P(a's beats b's), NaN left out."""
    P, N, _ = pref.shape
    M, S = num_models, num_samples
    if N != M * S:
        raise ValueError(f"pref is {tuple(pref.shape)}, expected (P, {M * S}, {M * S})")
    return torch.nanmean(pref.reshape(P, M, S, M, S), dim=(2, 4))  # (P, M, M)


def win_matrix_from_rewards(rewards: Tensor) -> Tensor:
    """Bradley-Terry win rates between models from scalar rewards.

    Args:
        rewards: (P, M, S) reward of model m's sample s on prompt p (NaN = abstained).
    Returns:
        (M, M), W[a, b] = mean_{p, s, s'} sigmoid(r[p, a, s] - r[p, b, s']), diagonal 1/2.
    """
    P, M, S = rewards.shape
    pref = bradley_terry_preferences(rewards.reshape(P, M * S).double())  # (P, M*S, M*S)
    return block_win_matrix(pref, M, S)


def find_cycles(win_matrix, threshold: float = 0.5) -> list[tuple[int, int, int]]:
    """All 3-cycles of the "beats" relation of a win-rate matrix.

    Args:
        win_matrix: (M, M) tensor or nested list, win_matrix[a][b] = P(a beats b).
        threshold: a beats b when win_matrix[a][b] > threshold (strictly: 0.5 is a tie).
    Returns:
        [(a, b, c), ...]: a beats b, b beats c and c beats a; each cycle once, rotated
        so that a is its smallest index; sorted.
    """
    w = win_matrix.tolist() if hasattr(win_matrix, "tolist") else [list(r) for r in win_matrix]
    m = len(w)
    if any(len(r) != m for r in w):
        raise ValueError(f"win_matrix must be square, got {m} rows of lengths {[len(r) for r in w]}")
    beats = [[a != b and w[a][b] is not None and w[a][b] > threshold for b in range(m)] for a in range(m)]
    cycles = []
    for a in range(m):
        for b in range(a + 1, m):
            for c in range(a + 1, m):
                if b != c and beats[a][b] and beats[b][c] and beats[c][a]:
                    cycles.append((a, b, c))
    return sorted(cycles)


def nan_mean(xs: Sequence[float | None]) -> float | None:
    """Mean of the values that are neither None nor NaN; None when there are none."""
    vals = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(vals) / len(vals) if vals else None
