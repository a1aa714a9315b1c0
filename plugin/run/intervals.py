"""Bootstrap 95 % intervals over prompts for evaluation's win rates (seeded, deterministic).

A win rate is a mean over prompts of per-prompt win rates; its interval resamples the
prompts with replacement (`draws` times, from `torch.Generator().manual_seed(seed)`), takes
the statistic of each resample, and reports the 2.5 % and 97.5 % quantiles (the percentile
bootstrap). Samples within a prompt stay together: they share the prompt's difficulty.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .length_control import fit_length_logistic

LEVEL, DRAWS, LC_DRAWS = 0.95, 1000, 200  # a length-controlled rate refits per draw: fewer


def prompt_resamples(num_prompts: int, draws: int, seed: int) -> Tensor:
    """(draws, P) prompt indices, each row P draws with replacement."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_prompts, (draws, num_prompts), generator=g)


def percentile_interval(values: Tensor, level: float = LEVEL) -> tuple[Tensor, Tensor]:
    """(lower, upper) quantiles over the first dim of (draws, ...) values, NaN left out."""
    tail = (1 - level) / 2
    return torch.nanquantile(values, tail, dim=0), torch.nanquantile(values, 1 - tail, dim=0)


def bootstrap_win_matrix(per_prompt: Tensor, draws: int = DRAWS, seed: int = 0,
                         level: float = LEVEL) -> tuple[Tensor, Tensor]:
    """Interval of each W[a, b] = nanmean over prompts of per_prompt[p, a, b].

    Args:
        per_prompt: (P, M, M) per-prompt win rates (NaN: no verdict on that prompt).
    Returns:
        (lower, upper), each (M, M); the diagonal is exactly 1/2.
    """
    idx = prompt_resamples(per_prompt.shape[0], draws, seed)  # (draws, P)
    means = torch.nanmean(per_prompt.double()[idx], dim=1)  # (draws, M, M)
    lo, hi = percentile_interval(means, level)
    lo.fill_diagonal_(0.5)
    hi.fill_diagonal_(0.5)
    return lo, hi


def bootstrap_lc(pref: Tensor, len_diff: Tensor, draws: int = LC_DRAWS, seed: int = 0,
                 level: float = LEVEL) -> tuple[float | None, float | None]:
    """Interval of the length-controlled win rate (`fit_length_logistic`), refit on each
    resample of the prompts. pref, len_diff: (P, K), K comparisons per prompt."""
    idx = prompt_resamples(pref.shape[0], draws, seed).numpy()
    y, d = pref.double().numpy(), len_diff.double().numpy()  # numpy: little overhead per refit
    fits = [fit_length_logistic(y[row], d[row])["lc"] for row in idx]
    values = torch.tensor([float("nan") if x is None else x for x in fits], dtype=torch.float64)
    if torch.isnan(values).all():
        return None, None
    lo, hi = percentile_interval(values, level)
    return float(lo), float(hi)
