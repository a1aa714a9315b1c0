"""The method registry: what each preference-optimisation method needs, said once.

Every layer (config validation, data loading, the candidate pipeline, iterated runs, the
report) asks the method's `MethodSpec` instead of comparing method names, in the way
torchtune marks a loss reference-free; what a method trains on is its `Target`. Adding a
method means a spec (here, or from any module through `register_method`), its loss and
its trainer; nothing else branches on names or label columns.

This module is a leaf: it imports nothing from POFE or from the training stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RoundPrompts = Literal["split", "all"]
# what a candidate is judged against (`MethodSpec.opponent`)
Opponent = Literal["candidates", "mixture"]


@dataclass(frozen=True)
class Target:
    """What a method trains on: one label per candidate, and how judges' verdicts become it.

    A judge gives either one scalar reward per candidate or a pairwise preference matrix.
    Labels are those rewards as they are, or the candidates' win rates (from the matrix, or
    from the rewards through `judge.preferences`): `from_win_rates` says which.
    """

    # the per-candidate label column of canonical and tokenised rows
    column: str
    # how messages name the labels ("rewards", "win rates")
    noun: str
    # labels are win rates (pairwise verdicts, or scalar ones through `judge.preferences`);
    # False: the scalar judge's rewards themselves (such a method takes no pairwise judge)
    from_win_rates: bool
    # (low, high): a label outside is an error in the data; None: any finite value
    bounds: tuple[float, float] | None = None
    # labels order candidates: two that differ must stay apart in float32 (training's precision)
    distinct_in_float32: bool = False
    # the run report's candidates column for the labels' per-prompt spread (None: no column)
    report_column: str | None = None


REWARDS = Target(column="rewards", noun="rewards", from_win_rates=False, distinct_in_float32=True)
WIN_RATES = Target(
    column="win_rates",
    noun="win rates",
    from_win_rates=True,
    bounds=(0.0, 1.0),
    report_column="cand. win-rate spread",
)
# Nash-MD's label: P(y beats y') of each policy sample against its opponent, formed as the win
# rates are (a pairwise judge's verdict, or a scalar judge's two rewards through `judge.preferences`)
PREFERENCES = Target(column="preferences", noun="preferences", from_win_rates=True, bounds=(0.0, 1.0))


@dataclass(frozen=True)
class MethodSpec:
    """One method's needs and defaults."""

    name: str
    # what the loss reads per candidate (`Target`): rewards (RRHF) or win rates (SPPO)
    target: Target
    # dotted path of the trainer class (imported lazily by the plugin)
    trainer: str
    # dataset `type:` values that can feed this method
    dataset_types: tuple[str, ...]
    # True when the loss compares against a frozen anchor policy (SPPO's pi_t): rows may carry
    # `anchor_logps`, and `KResponseTrainer` computes the anchor table when they do not
    needs_anchor: bool
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
    # what to do with a sampled candidate that is empty (end of turn at once): "drop" (counted;
    # nothing to rank), or "keep" for a policy gradient over every sample, where dropping it would
    # let a policy that says nothing escape every verdict
    empty_candidates: Literal["drop", "keep"] = "drop"
    # further logged metrics the run report keeps as curves, beside the loss and the diagnostic
    report_curves: tuple[str, ...] = ()
    # what the run report says under its rounds table about reading the diagnostic
    report_note: str = ""
    # what the report's headline says about the trained model's reward beside the candidates'
    # best-of-k: what the method makes of its candidates
    headline_note: str = ""
    # what a dataset row whose labels are all equal teaches; a warning counts such rows when set
    equal_labels_note: str = ""
    # `pofe:` keys that only this method reads; set to a non-default value under another
    # method they are an error
    own_keys: tuple[str, ...] = ()
    # what each candidate is judged against: the prompt's other candidates ("candidates": RRHF's
    # rewards, SPPO's win rates), or a response sampled while training from the geometric mixture
    # of the policy and pi_0 ("mixture": Nash-MD, `pofe.online.opponents`), which only online
    # training (`pofe.online`) has; the candidates are then the policy's own samples only
    opponent: Opponent = "candidates"
    # `pofe.online.kl_coef` is the loss's own KL(pi || pi_0) term (each row carries pi_0's log-probs
    # of its candidates, `pi_0_logps`), not a penalty on the judge's rewards (RRHF's)
    kl_in_loss: bool = False

    @property
    def trains_online_only(self) -> bool:
        """Whether the method needs `pofe.online` (its opponents are sampled while training)."""
        return self.opponent == "mixture"

    @property
    def takes_pairwise_judges(self) -> bool:
        """Whether a pairwise judge (a preference matrix per prompt) can label candidates."""
        return self.target.from_win_rates


RRHF = MethodSpec(
    name="rrhf",
    target=REWARDS,
    trainer="pofe.trainers.rrhf.RRHFTrainer",
    dataset_types=("pofe.prompts", "pofe.rrhf", "pofe.pairs"),
    needs_anchor=False,
    default_round_prompts="all",  # the paper's IP-n resamples the same prompts
    diagnostic_metric="rrhf/rank_accuracy",
    diagnostic_label="rank accuracy",
    candidate_keeps=("all",),
    dedupe_candidates=True,
    report_curves=("rrhf/rank", "rrhf/ft"),
    headline_note="RRHF's trained model tends to that best-of-k reward (it fine-tunes on each prompt's best "
    "candidate): when it reaches it, better candidates help more than more epochs.",
    equal_labels_note="RRHF learns no ranking from them, only SFT on their first response",
    own_keys=("rank_weight", "margin", "length_penalty"),
)

SPPO = MethodSpec(
    name="sppo",
    target=WIN_RATES,
    trainer="pofe.trainers.sppo.SPPOTrainer",
    dataset_types=("pofe.prompts", "pofe.pairs", "pofe.sppo", "pofe.sppo_ucla"),
    needs_anchor=True,
    default_round_prompts="split",  # the paper: disjoint prompt splits per iteration
    diagnostic_metric="sppo/win_rate_spread",
    diagnostic_label="win-rate spread",
    candidate_keeps=("all", "best_worst"),
    dedupe_candidates=False,  # the authors keep all K samples
    report_curves=("sppo/logratio", "sppo/target"),
    headline_note="SPPO moves each candidate's log-probability towards eta times its win rate's distance from "
    "1/2 (up for a candidate that wins more than half its comparisons, down for the rest), so the trained "
    "model should score above the policy's own samples; best-of-k shows how much better the candidates "
    "held, not a level SPPO converges to.",
    report_note="SPPO's win-rate spread near 0 means the judge sees no difference between samples "
    "(saturation: the gradient vanishes).",
    # e.g. win rates [1, 1]: not an error (each is a target of its own), but no preference
    equal_labels_note="SPPO learns no preference among their candidates, only to move every one by "
    "the same target eta * (win_rate - 1/2)",
    own_keys=("beta", "eta", "sppo_loss", "anchor_mix", "pi_0", "saturation_band"),
)

# the registered methods by name (`rl:` values); `register_method` adds to it
METHODS: dict[str, MethodSpec] = {}
# every dataset type POFE reads, and the methods it can feed
DATASET_TYPES: dict[str, tuple[str, ...]] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Make `spec` a POFE method: `rl: <spec.name>` then trains with it, from its dataset types.

    A method defined outside POFE registers from a module that every axolotl process
    imports: one listed under `plugins:` (axolotl imports every listed plugin's module
    before any plugin reads the config). Registering a name again replaces nothing: it is
    an error unless the spec is the same.
    """
    known = METHODS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"POFE method {spec.name!r} is registered already, with another spec")
    if known is None:
        METHODS[spec.name] = spec
        for dtype in spec.dataset_types:
            DATASET_TYPES[dtype] = (*DATASET_TYPES.get(dtype, ()), spec.name)
    return spec


NASH_MD = MethodSpec(
    name="nash_md",
    target=PREFERENCES,
    trainer="pofe.trainers.nash_md.NashMDTrainer",
    dataset_types=("pofe.prompts",),
    needs_anchor=False,
    default_round_prompts="all",  # not used: online only, one training
    diagnostic_metric="nash_md/preference",
    diagnostic_label="preference against the mixture",
    candidate_keeps=("all",),
    # each sample is a Monte-Carlo draw of the policy gradient: dropping duplicates would bias it
    dedupe_candidates=False,
    report_curves=("nash_md/kl", "nash_md/logp"),
    report_note="Nash-MD's preference is P(sample beats the mixture's sample): above 1/2 the policy beats its "
    "own mixture with pi_0; it moves toward 1/2 as the policy nears the regularised equilibrium.",
    headline_note="Nash-MD's trained model plays the regularised game against pi_0: its reward is the policy's "
    "own, not a level its samples bound.",
    own_keys=("nash_md",),
    empty_candidates="keep",
    opponent="mixture",
    kl_in_loss=True,
)

register_method(RRHF)
register_method(SPPO)
register_method(NASH_MD)


def method_spec(name: str) -> MethodSpec:
    """The spec of `name`, with an error listing the known methods."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown POFE method {name!r}; known: {sorted(METHODS)}") from None


def label_columns() -> tuple[str, ...]:
    """Every registered method's label column, in registration order (tokenised rows and
    batches carry whichever a dataset has)."""
    return tuple(dict.fromkeys(spec.target.column for spec in METHODS.values()))


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
