"""The judge interface: base types every judge and the factory import (a leaf).

Scalar judges give one reward per candidate (RRHF rewards; Bradley-Terry win rates for SPPO):

    judge.score(prompts, responses) -> list[list[float | Abstain]]        # P prompts x K_p

Pairwise judges give, per prompt, a (K, K) matrix P[i, j] = P(y_i beats y_j) whose pairs
were judged in both orders and combined with `symmetrize_preferences` (position bias):

    judge.preferences(prompts, responses) -> list[PairwiseVerdict]   # .matrix (K_p, K_p)

A judge that cannot give a verdict (an exception in a python judge, a non-finite score or one
beyond float32, an
unparseable LLM reply, a failed request) returns `Abstain(reason)`, never a sentinel number
such as -1 that could be trained on. Abstentions are counted in `judge.stats`; with
`allow_abstain: false` the first one stops the run and names the row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from pofe.errors import PofeError
from pofe_candidates.counts import Counts
from pofe_candidates.render import Prompt


@dataclass(frozen=True)
class Abstain:
    """The typed failure value: no verdict for this candidate (or pair), and why."""

    reason: str


class PromptCut(float):
    """A score of an input that lost the start of its prompt to the judge's length limit (the
    response kept whole): a float everywhere, and counted per row by the judge stage."""


Score = float | Abstain

# The largest score a judge may give: training reads labels in float32, where a larger one is
# inf. Rewards are only ordered (RRHF) or differenced over a temperature (Bradley-Terry), so
# any scale below it trains; a tighter bound would refuse legitimate scales (log-likelihood
# sums, raw counts).
MAX_SCORE = float(np.finfo(np.float32).max)


def row_place(row: int | str | None, prompt: int | None = None) -> str | None:
    """Where a judge error happened, as its message says it: `row`, the dataset row (an int), or
    the caller's own words for it (an online refresh's "dataset <file>, row <r> (0-based)"), else
    the prompt's position in the judge call."""
    if row is not None:
        return row if isinstance(row, str) else f"dataset row {row}"
    return None if prompt is None else f"prompt {prompt}"


class NotANumber(PofeError, TypeError):
    """A judge function returned something that is not a number: a bug in the judge, not a
    verdict. `prompt` is the prompt's position in the judge call, re-raised naming the dataset
    row (`at_row`) as `JudgeError` is."""

    def __init__(self, who: str, value: Any, where: str, expected: str, *, prompt=None, row=None):
        self.who, self.value, self.where, self.expected, self.prompt = who, value, where, expected, prompt
        place = row_place(row, prompt)
        super().__init__(
            f"{who} returned {type(value).__name__} {value!r:.40} for {f'{place}, ' if place else ''}{where}; "
            f"expected {expected}"
        )

    def at_row(self, row: int | str) -> NotANumber:
        return NotANumber(self.who, self.value, self.where, self.expected, row=row)


def as_number(
    value: Any, who: str, where: str, expected: str = "a number (int or float)", *, prompt: int | None = None
) -> float:
    """A judge function's result as a float; `NotANumber` naming `who` (the judge), `where` (the
    candidate) and `prompt` (its prompt's position in the call) for anything but a number:
    "0.7" or True are a judge's bug, not a verdict."""
    if isinstance(value, (str, bytes, bool, np.bool_)) or not hasattr(value, "__float__"):
        raise NotANumber(who, value, where, expected, prompt=prompt)
    return float(value)


def unusable_score(value: float, what: str) -> str | None:
    """Why a number is no verdict (non-finite, or beyond float32), or None when it is one."""
    if not math.isfinite(value):
        return f"non-finite {what}: {value}"
    if abs(value) > MAX_SCORE:
        return f"overflow: {what} {value:g} is beyond float32 (training's precision, max {MAX_SCORE:.3g})"
    return None


class JudgeError(PofeError, RuntimeError):
    """A verdict was missing and abstaining is not allowed.

    `prompt` is the prompt's position in the judge call; the pipeline, which knows the rows it
    passed, re-raises the error naming the dataset row (`at_row`).
    """

    def __init__(self, reason: str, where: str, *, prompt: int | None = None, row: int | str | None = None):
        self.reason, self.where, self.prompt = reason, where, prompt
        place = row_place(row, prompt)
        super().__init__(
            f"judge gave no verdict for {f'{place}, ' if place else ''}{where}: {reason} "
            "(set judge.allow_abstain: true to skip and count these)"
        )

    def at_row(self, row: int | str) -> JudgeError:
        return JudgeError(self.reason, self.where, row=row)


@dataclass
class JudgeStats(Counts):
    """Judge calls and abstentions (by reason), for summary.json."""

    calls: int = 0
    abstentions: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def count_call(self, n: int = 1) -> None:
        self.add("calls", n)

    def abstain(self, reason: str, *, allow: bool, where: str, prompt: int | None = None) -> Abstain:
        """Count an abstention and return it; raise JudgeError instead when not allowed.
        `prompt`: the prompt's position in the judge call, `where`: the rest (candidate, judge)."""
        if not allow:
            raise JudgeError(reason, where, prompt=prompt)
        self.add("abstentions", reason=reason)
        return Abstain(reason)


@dataclass(frozen=True)
class PairwiseVerdict:
    """matrix: (K, K) float64, P[i, j] = P(y_i beats y_j), P + P.T = 1, diagonal 1/2.
    abstained_pairs: unordered pairs for which neither order gave a verdict;
    abstain_reasons: one reason per abstained pair;
    orders_off: unordered pairs judged in both orders whose P(a, b) + P(b, a) is further than
        `ORDER_SUM_TOLERANCE` from 1; worst_order_sum: the sum furthest from 1 (None: no pair
        judged in both orders)."""

    matrix: torch.Tensor
    abstained_pairs: int = 0
    abstain_reasons: tuple[str, ...] = ()
    orders_off: int = 0
    worst_order_sum: float | None = None


class ScalarJudge(Protocol):
    """Capability flags, set explicitly by every judge (`apply.apply_judge` reads them):

    reads_rendered_prompt: the judge gets the prompt as the policy saw it (chat template
        applied, the generate stage's `rendered`) instead of the dataset's prompt.
    reads_columns: the judge's call also takes `columns=`, each prompt's other dataset columns.
    """

    stats: JudgeStats
    reads_rendered_prompt: bool
    reads_columns: bool

    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        """P prompts, P lists of K_p responses -> P lists of K_p scores (float or Abstain)."""
        ...


class PairwiseJudge(Protocol):
    """The capability flags mean what they mean for `ScalarJudge`."""

    stats: JudgeStats
    reads_rendered_prompt: bool
    reads_columns: bool

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        """P prompts, P lists of K_p responses -> P verdicts, one (K_p, K_p) matrix each."""
        ...


def is_pairwise(judge: ScalarJudge | PairwiseJudge) -> bool:
    """Whether the judge gives preference matrices (`preferences`) rather than scores."""
    return hasattr(judge, "preferences")
