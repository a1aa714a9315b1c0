"""The `pofe.nash_md` block, and what a method that plays the mixture needs of the recipe.

Nash-MD (Munos et al. 2023) judges each sample of the policy against an opponent sampled from
the geometric mixture pi_theta^(1 - beta) pi_0^beta (`pofe.losses.nash_md_mixture_logits`),
inside one online training (`pofe.online.opponents`). Declared here with its rules (pydantic
only, no torch) so `pofe.args` imports it cheaply.
"""

from __future__ import annotations

from pydantic import Field

from pofe.methods import method_spec
from pofe_candidates.config.strict import KnownKeys


class NashMDConfig(KnownKeys):
    """The `pofe.nash_md` block."""

    mixture_coef: float = Field(
        default=0.125,
        ge=0.0,
        le=1.0,
        description="beta: the opponent is sampled token by token from pi_theta^(1 - beta) pi_0^beta. 0: "
        "self-play against the policy itself; 1: against pi_0 (best response to the SFT model). The Nash-MD "
        "paper's best on TL;DR summarisation: 0.125-0.375.",
    )


def check_mixture_opponent(pofe) -> None:
    """A method whose opponent is the mixture (`MethodSpec.opponent`) trains online, on the
    policy's own samples, drawn by sampling: `pofe` is the validated PofeConfig."""
    spec = method_spec(pofe.method)
    if not spec.trains_online_only:
        return
    if pofe.online is None:
        raise ValueError(
            f"`rl: {pofe.method}` samples each opponent from the mixture of the policy and pi_0 while it trains: "
            "add a pofe.online block (refresh_every, kl_coef) with a pofe.prompts dataset, pofe.generate and "
            "pofe.judge"
        )
    generate = pofe.generate
    if generate is None:
        return  # _check_online names what is missing
    if generate.strategy != "sample":
        raise ValueError(
            f"generate.strategy: {generate.strategy}: `rl: {pofe.method}` is a policy gradient over samples of the "
            "policy (and of the mixture), which beam search does not draw: set strategy: sample"
        )
    if generate.include_dataset_responses:
        raise ValueError(
            f"generate.include_dataset_responses: {generate.include_dataset_responses}: `rl: {pofe.method}` trains "
            "on the policy's own samples only (its gradient is an expectation over them): remove it"
        )
    if generate.dedupe:
        raise ValueError(
            f"generate.dedupe: true: `rl: {pofe.method}` trains on every sample of the policy (dropping "
            "duplicates would bias its gradient toward rare responses): remove it"
        )
