"""Pure preference-optimisation losses: tensors in, ``(loss, stats)`` out."""

from .rrhf import rrhf_loss
from .sppo import sppo_hard_loss, sppo_loss

__all__ = ["rrhf_loss", "sppo_loss", "sppo_hard_loss"]
