"""SPPO: self-play preference optimisation.

Wu et al. 2024, "Self-Play Preference Optimization for Language Model Alignment",
arXiv 2405.00675: the squared-loss policy update of Algorithm 1 (TRL's DPOTrainer
cites it as Eq. (4.7)).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_same_shape(dims: tuple[int, ...], **tensors: Tensor) -> None:
    """Raise ValueError naming the first tensor whose shape is off."""
    first = next(iter(tensors.values()))
    for name, t in tensors.items():
        if t.dim() not in dims:
            raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dims, got shape {tuple(t.shape)}")
        if t.shape != first.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(first.shape)}")


def sppo_loss(
    logp: Tensor,
    anchor_logp: Tensor,
    win_rate: Tensor,
    *,
    eta: float = 1000.0,
    reduction: str = "mean",
    mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SPPO loss with soft win rates, for K sampled responses per prompt.

        logratio_i = logp_i - anchor_logp_i
        L_i        = (logratio_i - eta * (w_i - 1/2)) ** 2

    reduced by mean (the paper's expectation over prompts and responses) or sum over
    the real responses of the whole batch, so a batch mean weights every response
    equally. eta = 1/beta (eta = 1000 in the paper). The paper keeps only the best and
    worst response per prompt; that is a data choice, the loss is defined for any K.

    Args:
        logp: (B, K) or (K,) summed token log-probs under the trained policy.
        anchor_logp: same shape, under the frozen anchor pi_t (no gradient needed).
        win_rate: same shape, w_i = P(y_i beats pi_t | x) in [0, 1]
            (see ``pofe_candidates.win_rates``).
        eta: > 0, scale of the target log-ratio.
        reduction: "mean" or "sum".
        mask: same shape, bool, True for real responses; padded slots may hold
            anything (NaN included) and get exactly zero gradient.

    Returns:
        loss: scalar, float32 (float64 stays float64): eta * (w - 1/2) reaches
            hundreds and bf16 cannot resolve log-ratios next to it.
        stats: detached 0-dim tensors "loss", "logratio" (mean), "target" (mean
            eta * (w - 1/2)), "win_rate_spread" (mean over prompts of max w - min w), on the
            inputs' device: the trainer turns them into numbers once per logging step.

    One host synchronisation per call: the check that every prompt has a real response.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if eta <= 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    tensors = {"logp": logp, "anchor_logp": anchor_logp, "win_rate": win_rate}
    _check_same_shape((1, 2), **tensors, **({} if mask is None else {"mask": mask}))
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")

    dtype = torch.promote_types(logp.dtype, torch.float32)
    if mask is None:
        mask = torch.ones_like(logp, dtype=torch.bool)
    if logp.dim() == 1:  # (K,) -> (1, K)
        logp, anchor_logp, win_rate, mask = logp[None], anchor_logp[None], win_rate[None], mask[None]
    if not bool(mask.any(dim=1).all()):
        raise ValueError("mask: every prompt needs at least one real response")

    # Sanitise padded slots before arithmetic so NaN there cannot leak into gradients.
    logratio = torch.where(mask, logp.to(dtype) - anchor_logp.to(dtype), 0.0)  # (B, K)
    w = torch.where(mask, win_rate.to(dtype), 0.5)  # (B, K)
    target = eta * (w - 0.5)  # (B, K)
    per_response = torch.where(mask, (logratio - target) ** 2, 0.0)  # (B, K)
    n = mask.sum()
    loss = per_response.sum() if reduction == "sum" else per_response.sum() / n

    with torch.no_grad():
        w_max = torch.where(mask, w, float("-inf")).amax(dim=1)  # (B,)
        w_min = torch.where(mask, w, float("inf")).amin(dim=1)  # (B,)
        stats = {
            "loss": loss.detach(),
            "logratio": logratio.detach().sum() / n,
            "target": target.sum() / n,
            "win_rate_spread": (w_max - w_min).mean(),
        }
    return loss, stats


def mixed_anchor(anchor_logps: Tensor, pi_0_logps: Tensor, beta: float) -> Tensor:
    """SPPO's anchor regularised toward pi_0: the log of Nash-MD's geometric mixture.

        mixed_i = (1 - beta) * anchor_logps_i + beta * pi_0_logps_i
                = log( pi_t(y_i | x) ** (1 - beta) * pi_0(y_i | x) ** beta )

    SPPO (Wu et al. 2024) regresses log pi_theta(y) - log pi_t(y) onto eta (P(y beats pi_t) - 1/2):
    the idealised update pi_{t+1}(y) ~ pi_t(y) exp(eta P(y beats pi_t)), multiplicative
    weights. Theory guarantees the AVERAGE of those iterates, not the last: when preferences
    are intransitive (A > B > C > A) the last iterate can cycle, and re-anchoring on pi_t each
    iteration never penalises drift from the SFT model pi_0 (the SPPO seed's "what to
    watch": regularise towards the SFT model, as Nash-MD does, or average checkpoints).
    Nash-MD (Munos et al. 2023, "Nash Learning from Human Feedback", arXiv 2312.00886,
    Sec. 6) takes its step from the geometric mixture pi_t^(1 - beta) mu^beta of the policy
    and a reference mu (here pi_0), beta = eta * tau (learning rate times the KL
    regularisation's weight); its last iterate converges to the regularised game's
    equilibrium. Regressing onto this mixed anchor instead of log pi_t gives SPPO that pull
    toward pi_0; beta = 0 is the paper's SPPO, beta = 1 anchors every round on pi_0 itself.
    On the seed's four-response game (tests/losses/test_sppo_game.py) the plain last iterate
    cycles, and the mixed one converges (exploitability 0.046 at beta 0.1, 0.006 at 0.02).

    Deviations, both deliberate: the mixture is not normalised (its normaliser
    sum_y pi_t^(1 - beta) pi_0^beta, at most 1 by Hoelder's inequality, runs over every
    sequence and cannot be computed; SPPO's target drops its own log-normaliser likewise);
    and the win rates stay against pi_t, whose samples the candidates are (Nash-MD plays
    against samples of the mixture, which needs online generation).

    Args:
        anchor_logps: (B, K) or any shape: summed log pi_t(y | x) per response.
        pi_0_logps: same shape: summed log pi_0(y | x) for the same responses.
        beta: in [0, 1]. 0 returns `anchor_logps` itself (so padded or missing base entries,
            NaN, are never read); otherwise padded slots come out NaN where either input is,
            for the loss's mask to drop.

    Returns:
        (B, K) mixed anchor log-probs, float32 at least (float64 stays float64).
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return anchor_logps
    if pi_0_logps.shape != anchor_logps.shape:
        raise ValueError(f"pi_0_logps has shape {tuple(pi_0_logps.shape)}, expected {tuple(anchor_logps.shape)}")
    dtype = torch.promote_types(anchor_logps.dtype, torch.float32)
    return (1.0 - beta) * anchor_logps.to(dtype) + beta * pi_0_logps.to(dtype)


def sppo_hard_loss(
    chosen_logp: Tensor,
    chosen_anchor_logp: Tensor,
    rejected_logp: Tensor,
    rejected_anchor_logp: Tensor,
    *,
    beta: float = 0.001,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SPPO with hard labels, for plain chosen/rejected pairs.

        a = chosen_logp - chosen_anchor_logp,  b = rejected_logp - rejected_anchor_logp
        L = mean over pairs of (a - 1/(2 beta)) ** 2 + (b + 1/(2 beta)) ** 2

    This is the formula of TRL's DPOTrainer ``loss_type="sppo_hard"``: the paper's
    win rate set to 1 for the chosen and 0 for the rejected response. Hence
    ``sppo_loss`` on the stacked pair with win rates (1, 0) and eta = 1/beta equals
    this loss divided by 2 (it averages over the 2 responses, this sums them).

    Args:
        chosen_logp, chosen_anchor_logp, rejected_logp, rejected_anchor_logp:
            (B,) summed token log-probs under the policy and the anchor.
        beta: > 0, equal to 1/eta.

    Returns:
        loss: scalar, float32 (float64 stays float64).
        stats: detached 0-dim tensors "loss", "chosen_logratio", "rejected_logratio"
            (means) and "accuracy" (share of pairs with a > b). No host synchronisation.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    _check_same_shape(
        (1,),
        chosen_logp=chosen_logp,
        chosen_anchor_logp=chosen_anchor_logp,
        rejected_logp=rejected_logp,
        rejected_anchor_logp=rejected_anchor_logp,
    )
    dtype = torch.promote_types(chosen_logp.dtype, torch.float32)
    a = chosen_logp.to(dtype) - chosen_anchor_logp.to(dtype)  # (B,)
    b = rejected_logp.to(dtype) - rejected_anchor_logp.to(dtype)  # (B,)
    half = 0.5 / beta
    loss = ((a - half) ** 2 + (b + half) ** 2).mean()
    with torch.no_grad():
        stats = {
            "loss": loss.detach(),
            "chosen_logratio": a.detach().mean(),
            "rejected_logratio": b.detach().mean(),
            "accuracy": (a > b).to(dtype).mean(),
        }
    return loss, stats
