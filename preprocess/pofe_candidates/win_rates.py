"""Preference matrices and win rates for SPPO (Wu et al. 2024, arXiv 2405.00675).

P[..., i, j] = P(y_i beats y_j | x) over K responses to one prompt; shapes (K, K) for
one prompt, (B, K, K) for a batch. Pure torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def _check_square(name: str, m: Tensor) -> None:
    if m.dim() not in (2, 3) or m.shape[-1] != m.shape[-2]:
        raise ValueError(f"{name} must be (K, K) or (B, K, K), got shape {tuple(m.shape)}")
    if not m.is_floating_point():
        raise ValueError(f"{name} must be a float tensor, got {m.dtype}")


def _diagonal(m: Tensor) -> Tensor:
    """Bool (K, K) identity for m's last two dims, broadcastable over a batch."""
    return torch.eye(m.shape[-1], dtype=torch.bool, device=m.device)


def win_rates(pref: Tensor) -> Tensor:
    """Win rate of each response against the sampled set: w_i = mean_j P[i, j].

    The diagonal counts as 1/2 whatever it holds (NaN included): self-pairs are never
    judged, and a response ties with itself.

    Args:
        pref: (K, K) or (B, K, K), pref[..., i, j] = P(y_i beats y_j).
    Returns:
        (K,) or (B, K) win rates in [0, 1] when pref is a probability matrix.
    """
    _check_square("pref", pref)
    return torch.where(_diagonal(pref), 0.5, pref).mean(dim=-1)


def symmetrize_preferences(first_wins: Tensor) -> Tensor:
    """Average both presentation orders to remove a judge's position bias.

    first_wins[..., i, j] = P(first beats second) when y_i is shown first and y_j
    second. Then 1 - first_wins[..., j, i] is P(y_i beats y_j) with y_i shown second,
    and the both-orders estimate is

        P[i, j] = (first_wins[i, j] + 1 - first_wins[j, i]) / 2,

    so P[i, j] + P[j, i] = 1 exactly, and the diagonal (never judged, may hold
    anything) is set to 1/2. A judge that always prefers the first position by d
    (first_wins = Q + d off the diagonal, Q[i, j] + Q[j, i] = 1) gives back Q.

    Args:
        first_wins: (K, K) or (B, K, K), both orders judged for every pair i != j.
    Returns:
        same shape, a preference matrix for ``win_rates``.
    """
    _check_square("first_wins", first_wins)
    both = (first_wins + 1.0 - first_wins.transpose(-1, -2)) / 2
    return torch.where(_diagonal(first_wins), 0.5, both)


def bradley_terry_preferences(rewards: Tensor, temperature: float = 1.0) -> Tensor:
    """Preferences implied by scalar rewards: P[i, j] = sigmoid((r_i - r_j) / T).

    A scalar judge (reward model) makes preferences transitive: r_i > r_j > r_l gives
    P[i, l] > max(P[i, j], P[j, l]) > 1/2, and win rates order responses exactly as
    rewards do. Only a pairwise judge can express cycles (A > B > C > A), the case
    SPPO is built for. T sets the reward scale: rewards in [0, 1] at T = 1 give P within
    [0.27, 0.73]; T -> 0 tends to `hard_preferences`.

    Args:
        rewards: (K,) or (B, K).
        temperature: T > 0.
    Returns:
        (K, K) or (B, K, K), diagonal exactly 1/2.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    r = _float_rewards(rewards)
    return torch.sigmoid((r[..., :, None] - r[..., None, :]) / temperature)


def hard_preferences(rewards: Tensor) -> Tensor:
    """Sharp preferences from scalar rewards: P[i, j] = 1 if r_i > r_j, 1/2 if r_i = r_j, else 0.

    What a verifier means (right beats wrong, equals tie), and the limit of
    `bradley_terry_preferences` as T -> 0. Win rates are then
    w_i = (#{j: r_j < r_i} + #{j: r_j = r_i} / 2) / K, the self-pair counted as a tie.

    Args:
        rewards: (K,) or (B, K).
    Returns:
        (K, K) or (B, K, K) with entries in {0, 1/2, 1}, diagonal 1/2.
    """
    r = _float_rewards(rewards)
    return (torch.sign(r[..., :, None] - r[..., None, :]) + 1) / 2


def scalar_preferences(rewards: Tensor, mode: str, temperature: float = 1.0) -> Tensor:
    """`judge.preferences` for a scalar judge: "bradley_terry" (at `temperature`) or "hard"."""
    if mode == "bradley_terry":
        return bradley_terry_preferences(rewards, temperature)
    if mode == "hard":
        return hard_preferences(rewards)
    raise ValueError(f"preferences {mode!r} does not apply to scalar rewards; expected bradley_terry or hard")


def win_rate_spread(rates: Tensor) -> Tensor:
    """max_i w_i - min_i w_i: how far apart the judge sets a prompt's responses.

    SPPO's targets are eta (w_i - 1/2): a spread near 0 leaves the loss nothing to learn
    (`summary.json` and the run report give its mean over prompts).

    Args:
        rates: (K,) or (B, K) win rates, K >= 1.
    Returns:
        () or (B,).
    """
    if rates.dim() not in (1, 2) or rates.shape[-1] == 0:
        raise ValueError(f"rates must be (K,) or (B, K) with K >= 1, got shape {tuple(rates.shape)}")
    return rates.amax(dim=-1) - rates.amin(dim=-1)


# `pofe.saturation_band`'s default: a prompt whose win rates all lie this close to 1/2 is saturated
SATURATION_BAND = 0.05


def saturation(win_rates: Sequence[Sequence[float]], band: float = SATURATION_BAND) -> dict:
    """How much signal a round's win rates still carry (the SPPO seed's "win-rate saturation":
    as the policy improves its samples look alike to the judge, w -> 1/2 for all, and SPPO's
    targets eta (w - 1/2), with the gradient, vanish).

        saturated_share    = mean over prompts of [ max_i |w_i - 1/2| <= band ]  (the edge inside)
        mean_abs_deviation = mean over every candidate of every prompt of |w_i - 1/2|

    Args:
        win_rates: one list per prompt, its K candidates' win rates in [0, 1] (K may vary;
            NaN entries, e.g. abstentions, are left out; a prompt left empty is not counted).
        band: in (0, 1/2).
    Returns:
        {"band", "prompts": counted, "saturated_prompts", "saturated_share",
        "mean_abs_deviation"}; the share and the mean are None without a prompt.
    """
    if not 0.0 < band < 0.5:
        raise ValueError(f"band must be in (0, 1/2), got {band}")
    deviations = [[abs(w - 0.5) for w in rates if not math.isnan(w)] for rates in win_rates]
    deviations = [d for d in deviations if d]
    # 0.55 - 0.5 is 0.050000000000000044 in float64: a win rate on the band's edge counts inside
    saturated = sum(max(d) <= band + 1e-12 for d in deviations)
    flat = [x for d in deviations for x in d]
    return {
        "band": band,
        "prompts": len(deviations),
        "saturated_prompts": saturated,
        "saturated_share": saturated / len(deviations) if deviations else None,
        "mean_abs_deviation": sum(flat) / len(flat) if flat else None,
    }


def _float_rewards(rewards: Tensor) -> Tensor:
    if rewards.dim() not in (1, 2):
        raise ValueError(f"rewards must be (K,) or (B, K), got shape {tuple(rewards.shape)}")
    return rewards.to(torch.promote_types(rewards.dtype, torch.float32))  # int rewards too


def nan_mean(xs: Sequence[float | None]) -> float | None:
    """Mean of the scores that are neither None nor NaN (abstentions); None when there are none."""
    vals = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(vals) / len(vals) if vals else None
