"""RRHF: rank responses to align language models with human feedback.

Yuan et al. 2023, "RRHF: Rank Responses to Align Language Models with Human Feedback
without tears", arXiv 2304.05302, Eqs. (1)-(3).
"""

from __future__ import annotations

import torch
from torch import Tensor


def rrhf_loss(
    logp_sum: Tensor,
    lengths: Tensor,
    rewards: Tensor,
    *,
    mask: Tensor | None = None,
    rank_weight: float = 1.0,
    margin: float = 0.0,
    length_penalty: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """RRHF loss over k scored responses per prompt.

    For each prompt, with p_i = logp_sum_i / lengths_i ** length_penalty:

        L_rank = sum_{(i, j): r_i < r_j} max(0, p_i - p_j + margin)
        L_ft   = -logp_sum_b,   b = argmax_i r_i  (ties: the first index)
        L      = rank_weight * L_rank + L_ft

    and the returned loss is the mean of L over prompts.

    Deviations from the paper (all default to the paper's choice):
      - ``margin``: the paper's hinge has none (margin = 0). A positive margin keeps
        pushing pairs that are ordered right by less than ``margin``.
      - ``length_penalty``: the paper divides by |y| (exponent 1); 0 uses summed
        log-probs, other exponents interpolate/extrapolate.
      - ``rank_weight``: the paper weights L_rank by 1.
    Tied rewards form no pair (as in the paper); a tie for the best goes to the first
    index, so the result does not depend on sort stability.

    Args:
        logp_sum: (B, k) or (k,) summed token log-probs of each response.
        lengths: same shape, response token counts (int or float, > 0 where real).
        rewards: same shape, scalar rewards; only their order matters.
        mask: same shape, bool, True for real candidates (k may vary per prompt).
            Padded slots may hold anything, NaN and inf included: they are replaced
            with ``torch.where`` before any arithmetic, so they reach neither the loss
            nor the gradients (which are exactly zero there).
        rank_weight, margin, length_penalty: see above; each must be >= 0.

    Returns:
        loss: scalar. Computed in float32 (float64 inputs stay float64): bf16 has too
            few mantissa bits for hinge differences of near-equal scores.
        stats: detached 0-dim tensors on the inputs' device (no host synchronisation:
            the trainer turns them into numbers once per logging step). "rank" and "ft":
            means over prompts of L_rank and L_ft; "rank_accuracy": share of reward-ordered
            pairs (over the whole batch) with p_i < p_j strictly, NaN if the batch has no
            ordered pair; "best_score": mean p_b; "other_score": mean p_i over real non-best
            candidates (NaN if none).

    One host synchronisation per call: the value checks (every prompt has a real candidate,
    lengths > 0, finite rewards) read one flag.
    """
    names = ("logp_sum", "lengths", "rewards", "mask")
    tensors = (logp_sum, lengths, rewards, mask)
    for name, t in zip(names, tensors):
        if t is None:
            continue
        if t.dim() not in (1, 2):
            raise ValueError(f"{name} must be (k,) or (B, k), got shape {tuple(t.shape)}")
        if t.shape != logp_sum.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(logp_sum.shape)}")
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    if not logp_sum.is_floating_point():
        raise ValueError(f"logp_sum must be a float tensor, got {logp_sum.dtype}")
    for name, value in (("rank_weight", rank_weight), ("margin", margin), ("length_penalty", length_penalty)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")

    dtype = torch.promote_types(logp_sum.dtype, torch.float32)
    if logp_sum.dim() == 1:  # (k,) -> (1, k)
        logp_sum, lengths, rewards = logp_sum[None], lengths[None], rewards[None]
        mask = None if mask is None else mask[None]
    if mask is None:
        mask = torch.ones_like(logp_sum, dtype=torch.bool)

    # Sanitise padded slots first, so NaN/inf there cannot leak through 0 * NaN.
    lp = torch.where(mask, logp_sum.to(dtype), 0.0)  # (B, k)
    n = torch.where(mask, lengths.to(dtype), 1.0)  # (B, k)
    r = torch.where(mask, rewards.to(dtype), 0.0)  # (B, k)
    has_candidate = mask.any(dim=1).all()
    if not bool(has_candidate & (n > 0).all() & torch.isfinite(r).all()):  # the one synchronisation
        if not bool(has_candidate):
            raise ValueError("mask: every prompt needs at least one real candidate")
        raise ValueError("lengths must be > 0 and rewards finite for real candidates")

    p = lp / n**length_penalty  # (B, k)
    # ordered[b, i, j]: both real and r_i < r_j, i.e. i should score below j.
    ordered = (r[:, :, None] < r[:, None, :]) & mask[:, :, None] & mask[:, None, :]  # (B, k, k)
    hinge = torch.relu(p[:, :, None] - p[:, None, :] + margin)  # (B, k, k)
    l_rank = torch.where(ordered, hinge, 0.0).sum(dim=(1, 2))  # (B,)

    # argmax returns the first maximal index, which is the tie rule we want.
    best = torch.where(mask, r, float("-inf")).argmax(dim=1, keepdim=True)  # (B, 1)
    l_ft = -lp.gather(1, best).squeeze(1)  # (B,)
    loss = (rank_weight * l_rank + l_ft).mean()

    with torch.no_grad():
        pd = p.detach()
        correct = (ordered & (pd[:, :, None] < pd[:, None, :])).sum()
        is_best = torch.zeros_like(mask).scatter_(1, best, True)  # (B, k)
        others = mask & ~is_best
        stats = {
            "rank": l_rank.mean(),
            "ft": l_ft.mean(),
            "rank_accuracy": mean_or_nan(correct, ordered.sum()),
            "best_score": pd.gather(1, best).mean(),
            "other_score": mean_or_nan(torch.where(others, pd, 0.0).sum(), others.sum()),
        }
    return loss, stats


def mean_or_nan(total: Tensor, count: Tensor) -> Tensor:
    """total / count as a 0-dim tensor, NaN where count is 0, without reading either on the host."""
    return torch.where(count > 0, total / count.clamp(min=1), float("nan"))


def kl_penalised_rewards(rewards: Tensor, logp: Tensor, pi_0_logps: Tensor, kl_coef: float) -> Tensor:
    """The reward online RRHF ranks by, penalised by the sampled log-ratio to pi_0:

        r'_i = r_i - kl_coef * (log pi(y_i | x) - log pi_0(y_i | x))

    with y_i ~ pi, the policy that sampled it, so the log-ratio is a one-sample estimate of
    KL(pi || pi_0) for that prompt. The RRHF paper's fix for reward hacking under fully online
    sampling (Sec. 4, kl_coef 0.01). All tensors (B, K), summed response log-probs.
    """
    return rewards - kl_coef * (logp - pi_0_logps)
