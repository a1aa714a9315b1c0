"""Evaluation's comparisons between iterates: intervals, lengths, length-controlled rates.

From the judge's response preferences on the held-out prompts (any judge: a pairwise
judge's own, a scalar judge's through Bradley-Terry, `pofe.run.judging`) and the answers'
lengths in tokens, eval.json's

- `win_matrix_ci95`: [M][M][lower, upper], a bootstrap 95 % interval over prompts of each
  W[a, b] (`pofe.run.intervals`);
- `vs_pi_0` and `vs_previous`: per model (None for pi_0), its raw win rate against pi_0 and
  against the iterate before it (W[t, 0], W[t, t-1]) beside the length-controlled one
  (`pofe.run.length_control`), each with its interval, and the fitted length slope;
- `response_tokens`: each model's mean and median answer length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .intervals import bootstrap_lc, bootstrap_win_matrix
from .length_control import fit_length_logistic, pair_observations
from .tournament import block_win_matrix, per_prompt_win_matrix


def median(xs: list[float]) -> float | None:
    """The middle value (the mean of the two middle ones for an even count); None if empty."""
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def versus(pref: Tensor, tokens: Tensor, win_matrix: Tensor, ci: tuple[Tensor, Tensor], a: int, b: int,
           seed: int) -> dict:
    """Model a against model b: raw and length-controlled win rates with intervals."""
    y, d = pair_observations(pref, tokens, a, b)
    fit = fit_length_logistic(y, d)
    lo, hi = bootstrap_lc(y, d, seed=seed)
    return {
        "raw": float(win_matrix[a, b]), "raw_ci95": [float(ci[0][a, b]), float(ci[1][a, b])],
        "lc": fit["lc"], "lc_ci95": [lo, hi], "length_slope": fit["b"], "comparisons": fit["n"],
    }


def compare_iterates(pref: Tensor, tokens: Tensor, seed: int = 0) -> dict:
    """eval.json's comparisons.

    Args:
        pref: (P, M*S, M*S) response preferences, responses model-major.
        tokens: (P, M, S) response lengths in tokens.
        seed: the bootstrap's seed (the evaluation's `pofe.eval.seed`).
    """
    P, M, S = tokens.shape
    w = block_win_matrix(pref, M, S)  # eval.json's win_matrix
    ci = bootstrap_win_matrix(per_prompt_win_matrix(pref, M, S), seed=seed)
    vs_base = [None] + [versus(pref, tokens, w, ci, m, 0, seed) for m in range(1, M)]
    # pi_1's previous iterate is pi_0: the same comparison
    vs_prev = [None] + [vs_base[1] if m == 1 else versus(pref, tokens, w, ci, m, m - 1, seed) for m in range(1, M)]
    per_model = [tokens[:, m].reshape(-1).tolist() for m in range(M)]
    return {
        "win_matrix_ci95": torch.stack(ci, dim=-1).tolist(),
        "vs_pi_0": vs_base,
        "vs_previous": vs_prev,
        "response_tokens": {"mean": [sum(x) / len(x) for x in per_model], "median": [median(x) for x in per_model]},
    }
