"""The `pofe.online` block: train on candidates sampled from the moving policy.

With it, `axolotl train` on a `pofe.prompts` dataset does not sample the candidates once
before training: every `refresh_every` optimizer steps the trainer samples them for the
prompts of the next `refresh_every` steps from the policy as it is then, judges them, and
trains on them (`pofe.online`). Declared here (pydantic only, no torch) so `pofe.args`
imports it cheaply.
"""

from __future__ import annotations

from pydantic import Field

from pofe.preprocess.config.base import KnownKeys

# the backends that sample from the policy as it trains (`pofe.online.sampling`)
ONLINE_BACKENDS = ("transformers",)


class OnlineConfig(KnownKeys):
    """The `pofe.online` block."""

    refresh_every: int = Field(
        default=32,
        ge=1,
        description="Optimizer steps between refreshes: each refresh samples and judges the candidates of the "
        "prompts of the next refresh_every steps from the policy as it is (1: every step, on-policy; the steps "
        "of an epoch: the offline iteration). The optimizer and the schedule run on across refreshes.",
    )
    kl_coef: float = Field(
        default=0.0,
        ge=0.0,
        description="RRHF: each candidate's reward becomes reward - kl_coef * (log pi(y|x) - log pi_0(y|x)), "
        "the RRHF paper's fix for online reward hacking (it used 0.01); pi_0 is the base model (the adapter "
        "disabled under LoRA/QLoRA, a frozen copy under full fine-tuning). 0: off.",
    )
