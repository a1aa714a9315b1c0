"""Pure preference-optimisation losses: tensors in, ``(loss, stats)`` out."""

from pofe.losses.nash_md import nash_md_loss, nash_md_mixture_logits
from pofe.losses.rrhf import kl_penalised_rewards, rrhf_loss
from pofe.losses.sppo import mixed_anchor, sppo_hard_loss, sppo_loss

__all__ = [
    "rrhf_loss",
    "kl_penalised_rewards",
    "sppo_loss",
    "sppo_hard_loss",
    "mixed_anchor",
    "nash_md_loss",
    "nash_md_mixture_logits",
]
