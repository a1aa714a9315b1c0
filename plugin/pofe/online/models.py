"""The models a refresh uses: the policy as it trains, and pi_0 for RRHF's KL penalty and SPPO's
anchor mixed toward pi_0.

The policy samples and scores through TRL's `unwrap_model_for_generation`, which takes it out
of accelerate's and DeepSpeed's wrappers and, under ZeRO-3, gathers its weights on every rank
for the refresh (each rank then samples its own prompts without collectives). pi_0 is the
base model: under LoRA/QLoRA the policy with its adapter disabled (no second model: one more
no-grad pass), under full fine-tuning a frozen copy loaded once, in the recipe's dtype, beside
the policy (its weights once more in memory, partitioned under ZeRO-3 as the policy's are and
gathered for each refresh; `axolotl pofe plan` counts it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from trl.distributed import DistributedBackend

from pofe.anchor.pi_0 import adapter_disabled, recipe_dtype
from pofe.logs import get_logger

LOG = get_logger(__name__)


@contextmanager
def policy_for_refresh(trainer) -> Iterator[torch.nn.Module]:
    """The trained policy, whole and in eval mode, for sampling and scoring (back to training after)."""
    from trl.models.utils import unwrap_model_for_generation

    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        was_training = model.training
        model.eval()
        try:
            yield model
        finally:
            model.train(was_training)


class BasePolicy:
    """pi_0 for `pofe.online.kl_coef` and `pofe.anchor_mix`: the adapter-disabled policy, or a frozen copy."""

    def __init__(self, cfg, accelerator):
        self.cfg, self.accelerator = cfg, accelerator
        self.copy: torch.nn.Module | None = None

    @property
    def is_adapter(self) -> bool:
        return self.cfg.adapter in ("lora", "qlora")

    @contextmanager
    def scoring(self, policy: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """pi_0, given the unwrapped `policy` (whose adapter is disabled meanwhile under LoRA)."""
        if self.is_adapter:
            with adapter_disabled(policy) as base:
                yield base
            return
        if self.copy is None:
            from pofe_candidates.generators.hf import load_policy

            LOG.info(
                f"POFE: pi_0 (pofe.online.kl_coef, pofe.anchor_mix) under full fine-tuning: loading a frozen copy of {self.cfg.base_model} "
                "as pi_0 (its weights stay in memory beside the policy's)"
            )
            self.copy = load_policy(
                str(self.cfg.base_model), device=self.accelerator.device, dtype=recipe_dtype(self.cfg)
            )
            self.copy.requires_grad_(False)
        # under ZeRO-3 the copy loads partitioned, as the policy does: whole for the refresh only
        with DistributedBackend(self.accelerator).gather_params(list(self.copy.parameters())):
            yield self.copy
