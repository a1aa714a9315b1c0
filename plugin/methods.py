"""The method registry: what each preference-optimisation method needs, said once.

Every layer (config validation, data loading, the candidate pipeline, iterated runs, the
report) asks the method's `MethodSpec` instead of comparing method names, in the way
torchtune marks a loss reference-free. Adding a method means adding its spec here, its
loss in `pofe.losses` and its trainer in `pofe.trainers`; nothing else branches on names.

This module is a leaf: it imports nothing from POFE or from the training stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RoundPrompts = Literal["split", "all"]


@dataclass(frozen=True)
class MethodSpec:
    """One method's needs and defaults."""

    name: str
    # the per-candidate label column the loss reads: "rewards" (RRHF) or "win_rates" (SPPO)
    target: str
    # dotted path of the trainer class (imported lazily by the plugin)
    trainer: str
    # dataset `type:` values that can feed this method
    dataset_types: tuple[str, ...]
    # True when the loss compares against a frozen anchor policy (SPPO's pi_t)
    needs_anchor: bool
    # True when the method can learn from pairwise judges (a preference matrix per prompt);
    # False when it needs one scalar reward per candidate
    takes_pairwise_judges: bool
    # `pofe.round_prompts: auto` in iterated runs: disjoint splits, or every prompt each round
    default_round_prompts: RoundPrompts
    # the trainer's metric that says whether training moves the right way (report, plots)
    diagnostic_metric: str
    # how the report names that metric
    diagnostic_label: str
    # `pofe.candidates.keep` values that make sense for this method
    candidate_keeps: tuple[str, ...]
    # `pofe.generate.dedupe` when unset: RRHF ranks distinct responses; SPPO's win rates are a
    # Monte-Carlo estimate over K policy samples, which dropping duplicates would bias
    dedupe_candidates: bool
    # `pofe.candidates.truncated` when unset: what to do with candidates cut at max_new_tokens.
    # "keep" for both, as the RRHF and SPPO authors' scripts do (they filter nothing). A kept one
    # is trained as if finished (the template's end-of-turn token is appended and scored);
    # "drop" avoids that, but loses every candidate of a policy that rarely stops within
    # max_new_tokens (an untrained model: all of them)
    truncated_candidates: Literal["drop", "keep"] = "keep"
    # further logged metrics the run report keeps as curves, beside the loss and the diagnostic
    report_curves: tuple[str, ...] = ()
    # what the run report says under its rounds table about reading the diagnostic
    report_note: str = ""


RRHF = MethodSpec(
    name="rrhf",
    target="rewards",
    trainer="pofe.trainers.rrhf.RRHFTrainer",
    dataset_types=("pofe.prompts", "pofe.rrhf", "pofe.pairs"),
    needs_anchor=False,
    takes_pairwise_judges=False,
    default_round_prompts="all",  # the paper's IP-n resamples the same prompts
    diagnostic_metric="rrhf/rank_accuracy",
    diagnostic_label="rank accuracy",
    candidate_keeps=("all",),
    dedupe_candidates=True,
    report_curves=("rrhf/rank", "rrhf/ft"),
)

SPPO = MethodSpec(
    name="sppo",
    target="win_rates",
    trainer="pofe.trainers.sppo.SPPOTrainer",
    dataset_types=("pofe.prompts", "pofe.pairs", "pofe.sppo", "pofe.sppo_ucla"),
    needs_anchor=True,
    takes_pairwise_judges=True,
    default_round_prompts="split",  # the paper: disjoint prompt splits per iteration
    diagnostic_metric="sppo/win_rate_spread",
    diagnostic_label="win-rate spread",
    candidate_keeps=("all", "best_worst"),
    dedupe_candidates=False,  # the authors keep all K samples
    report_curves=("sppo/logratio", "sppo/target"),
    report_note="SPPO's win-rate spread near 0 means the judge sees no difference between samples "
    "(saturation: the gradient vanishes).",
)

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (RRHF, SPPO)}

# every dataset type POFE reads, and the methods it can feed
DATASET_TYPES: dict[str, tuple[str, ...]] = {}
for _spec in METHODS.values():
    for _type in _spec.dataset_types:
        DATASET_TYPES.setdefault(_type, ())
        DATASET_TYPES[_type] += (_spec.name,)
del _spec, _type

# the `pofe.method` values, as a type pydantic turns into a choice
MethodName = Literal[tuple(METHODS)]


def method_spec(name: str) -> MethodSpec:
    """The spec of `name`, with an error listing the known methods."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown POFE method {name!r}; known: {sorted(METHODS)}") from None


def check_candidate_rules(method: str, *, pairwise_judge: str | None, keep: str) -> None:
    """The rules between a method and how its candidates are judged and kept, declared once.

    Both the `pofe:` config and the candidate pipeline (which can run without it) call this.

    Args:
        method: a registered method name.
        pairwise_judge: the judge's type when it gives pairwise preferences, else None.
        keep: the `candidates.keep` policy.

    Raises:
        ValueError naming the setting to change.
    """
    spec = method_spec(method)
    if pairwise_judge is not None and not spec.takes_pairwise_judges:
        takers = [name for name, s in METHODS.items() if s.takes_pairwise_judges]
        raise ValueError(
            f"judge.type: {pairwise_judge} gives pairwise preferences; {method.upper()} needs a "
            f"scalar reward per candidate: use a python, reward_model or llm judge (or method "
            f"{' / '.join(takers)})"
        )
    if keep not in spec.candidate_keeps:
        users = [name for name, s in METHODS.items() if keep in s.candidate_keeps]
        raise ValueError(f"candidates.keep: {keep} applies to method {' / '.join(users)} only")
