"""The models a refresh uses: the policy as it trains, and pi_0 (RRHF's KL penalty, SPPO's anchor
mixed toward pi_0, Nash-MD's loss and mixture).

The policy samples and scores through TRL's `unwrap_model_for_generation`, which takes it out
of accelerate's and DeepSpeed's wrappers and, under ZeRO-3, gathers its weights on every rank
for the refresh (each rank then samples its own prompts without collectives). pi_0 is the
base model: under LoRA/QLoRA the policy with its adapter disabled (no second model: one more
no-grad pass), under full fine-tuning a frozen copy loaded once, in the recipe's dtype, beside
the policy (its weights once more in memory, partitioned under ZeRO-3 as the policy's are and
gathered for each refresh; `axolotl pofe plan` counts it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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


class Pi0Policy:
    """pi_0 for `pofe.online.kl_coef`, `pofe.anchor_mix` and Nash-MD: the adapter-disabled policy, or a frozen copy."""

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
        with self._gathered_copy() as copy:
            yield copy

    @contextmanager
    def forward(self, policy: torch.nn.Module) -> Iterator[Callable[..., Any]]:
        """pi_0's forward, `forward(**inputs) -> outputs`, callable between forwards of the unwrapped
        `policy` (Nash-MD samples its opponent from both, token by token): under LoRA/QLoRA each call
        runs with the adapter disabled and the policy's adapter is back on between calls."""
        if self.is_adapter:

            def pi_0_forward(**inputs):
                with adapter_disabled(policy) as base:
                    return base(**inputs)

            yield pi_0_forward
            return
        with self._gathered_copy() as copy:
            yield copy

    @contextmanager
    def _gathered_copy(self) -> Iterator[torch.nn.Module]:
        """The frozen copy (loaded at the first call), whole: under ZeRO-3 it loads partitioned, as the
        policy does, and is gathered for the refresh only."""
        if self.copy is None:
            from pofe_candidates.models import load_policy

            LOG.info(
                f"POFE: pi_0 under full fine-tuning: loading a frozen copy of {self.cfg.base_model} "
                "(its weights stay in memory beside the policy's)"
            )
            self.copy = load_policy(
                str(self.cfg.base_model), device=self.accelerator.device, dtype=recipe_dtype(self.cfg)
            )
            self.copy.requires_grad_(False)
        with DistributedBackend(self.accelerator).gather_params(list(self.copy.parameters())):
            yield self.copy
