"""Nash-MD: Nash learning from human feedback by mirror descent against a geometric mixture.

Munos et al. 2023, "Nash Learning from Human Feedback", arXiv 2312.00886: the policy plays
against pi_mix(y) proportional to pi_theta(y)^(1 - beta) pi_0(y)^beta (Sec. 6), taken per token
for sequences, and Nash-MD-PG (Sec. 7) trains it by a KL-regularised policy gradient with the
preference P(y beats y') of its own sample y over the mixture's y' as the reward.
"""

from __future__ import annotations

import torch
from torch import Tensor


def nash_md_mixture_logits(policy_logits: Tensor, ref_logits: Tensor, mixture_coef: float) -> Tensor:
    """The next-token log-probabilities of the geometric mixture of the policy and pi_0:

        log pi_mix(. | x, y_<t) = log_softmax( (1 - beta) log_softmax(policy_logits)
                                               + beta log_softmax(ref_logits) )

    with beta = `mixture_coef`: pi_theta(. | ...)^(1 - beta) pi_0(. | ...)^beta, normalised over
    the vocabulary at each step. Sampling token by token from these gives Nash-MD's opponent (the
    paper's per-token mixture; the normaliser of the whole-sequence mixture has no closed form).
    beta = 0 is the policy itself (self-play), beta = 1 is pi_0.

    Args:
        policy_logits: (..., V) the policy's next-token logits (any leading shape).
        ref_logits: (..., V) pi_0's, at the same positions.
        mixture_coef: beta in [0, 1].

    Returns:
        (..., V) normalised log-probabilities (logits for sampling), float32 at least (float64
        stays float64): bf16 logits would round the weighted sum of two log-softmaxes.
    """
    if not 0.0 <= mixture_coef <= 1.0:
        raise ValueError(f"mixture_coef must be in [0, 1], got {mixture_coef}")
    if policy_logits.shape != ref_logits.shape:
        raise ValueError(f"ref_logits has shape {tuple(ref_logits.shape)}, expected {tuple(policy_logits.shape)}")
    dtype = torch.promote_types(policy_logits.dtype, torch.float32)
    policy = torch.log_softmax(policy_logits.to(dtype), dim=-1)
    ref = torch.log_softmax(ref_logits.to(dtype), dim=-1)
    return torch.log_softmax((1.0 - mixture_coef) * policy + mixture_coef * ref, dim=-1)


def nash_md_loss(
    logps: Tensor, pi_0_logps: Tensor, preference: Tensor, kl_coef: float, mask: Tensor | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Nash-MD-PG's loss over N samples y_i of the policy, each against an opponent y'_i of the mixture.

    Its gradient, in expectation over y ~ pi_theta, is minus Nash-MD-PG's ascent direction

        E_y[ (P(y beats y') - 1/2) grad log pi_theta(y) ] - tau grad KL(pi_theta || pi_0),

    tau = `kl_coef`, from the per-sample surrogate (summed over tokens, averaged over the N samples):

        L_i = - (P_i - 1/2) * log pi_theta(y_i)                          REINFORCE, baseline 1/2
              + tau * sg[log pi_theta(y_i) - log pi_0(y_i)] * log pi_theta(y_i)

    with sg[.] no gradient (detached). The KL term is the score-function estimator:
    grad KL(pi || pi_0) = E_y[(log pi(y) - log pi_0(y)) grad log pi(y)] + E_y[grad log pi(y)], and the
    last expectation is 0. A loss term tau (log pi(y) - log pi_0(y)) alone has expected gradient
    tau E_y[grad log pi(y)] = 0 for samples of pi: it would not regularise at all. The baseline 1/2
    is P(y beats y) for any y, so the advantage is zero when the policy ties its opponent. The
    log-ratio is the whole sequence's (not token by token, as TRL's NashMDTrainer took it, whose
    expected gradient misses the cross terms between a token and the later tokens' log-ratios).
    The loss value itself is a surrogate: only its gradient means something.

    The expectation holds for samples of the policy being trained: with `pofe.online.refresh_every`
    > 1 the later steps of a window train on samples of the policy that sampled it, as TRL's GRPO
    does over `steps_per_generation` (no importance correction).

    Args:
        logps: (N,) or (B, K) summed log pi_theta(y_i | x_i) of the policy's samples (with gradient).
        pi_0_logps: same shape, summed log pi_0(y_i | x_i) (no gradient needed).
        preference: same shape, P(y_i beats y'_i) in [0, 1], y'_i the mixture's sample for the same prompt.
        kl_coef: tau >= 0.
        mask: same shape, bool, True for the real samples the mean is over (default: all); padded
            slots may hold anything (NaN included) and get exactly zero gradient.

    Returns:
        loss: scalar, float32 at least (float64 stays float64).
        stats: detached 0-dim tensors: "loss"; "preference" (mean P_i); "kl" (mean
            log pi_theta(y_i) - log pi_0(y_i), a one-sample estimate of KL(pi_theta || pi_0) for
            on-policy samples); "logp" (mean log pi_theta(y_i)).

    One host synchronisation per call: the check that a real sample exists and every real
    preference lies in [0, 1] (the trainer reads the stats once per logging step).
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    if mask is None:
        mask = torch.ones_like(logps, dtype=torch.bool)
    if logps.dim() not in (1, 2):
        raise ValueError(f"logps must have shape (N,) or (B, K), got {tuple(logps.shape)}")
    for name, t in (("pi_0_logps", pi_0_logps), ("preference", preference), ("mask", mask)):
        if t.shape != logps.shape:
            raise ValueError(f"{name} must have the shape of logps {tuple(logps.shape)}, got {tuple(t.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {mask.dtype}")
    dtype = torch.promote_types(logps.dtype, torch.float32)
    # padded slots are replaced before any arithmetic, so a NaN there reaches neither loss nor gradient
    pref = torch.where(mask, preference.to(dtype), 0.5)
    if not bool(mask.any() & ((pref >= 0) & (pref <= 1)).all()):
        if not bool(mask.any()):
            raise ValueError("nash_md_loss needs at least one real sample (N >= 1)")
        raise ValueError(f"preference must lie in [0, 1], got {preference[mask].tolist()}")
    logp = torch.where(mask, logps.to(dtype), 0.0)
    ratio = torch.where(mask, logp - pi_0_logps.to(dtype), 0.0).detach()
    n = mask.sum()
    per_sample = torch.where(mask, -(pref - 0.5) * logp + kl_coef * ratio * logp, 0.0)
    loss = per_sample.sum() / n
    with torch.no_grad():
        stats = {
            "loss": loss.detach(),
            "preference": torch.where(mask, pref, 0.0).sum() / n,
            "kl": ratio.sum() / n,
            "logp": logp.detach().sum() / n,
        }
    return loss, stats
