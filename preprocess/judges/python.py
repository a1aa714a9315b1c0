"""Python judges: a user function, scalar `module:function(prompt, response) -> float` or
pairwise `module:function(prompt, response_a, response_b) -> P(a beats b)`."""

from __future__ import annotations

import math
from typing import Callable

from ..render import Prompt
from .base import Abstain, JudgeStats, PairwiseVerdict, Score
from .pairwise import preferences_both_orders


class PythonJudge:
    """`module:function(prompt, response) -> float`, called once per candidate.

    `prompt` is the dataset's prompt as stored (a string or chat messages). Exceptions and
    non-finite results become abstentions naming the exception.
    """

    reads_rendered_prompt = False  # the user's function gets the dataset's prompt as stored
    reads_columns = False

    def __init__(self, fn: Callable[[Prompt, str], float], *, allow_abstain: bool = True, name: str = "python"):
        self.fn = fn
        self.allow_abstain = allow_abstain
        self.name = name
        self.stats = JudgeStats()

    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        out: list[list[Score]] = []
        for p, (prompt, cands) in enumerate(zip(prompts, responses, strict=True)):
            row: list[Score] = []
            for k, resp in enumerate(cands):
                self.stats.count_call()
                at = dict(allow=self.allow_abstain, where=f"candidate {k} ({self.name})", prompt=p)
                row.append(_call(self.fn, (prompt, resp), self.stats, at, "score"))
            out.append(row)
        return out


class PythonPairwiseJudge:
    """`module:function(prompt, response_a, response_b) -> P(a beats b)`, called for every
    ordered pair (both orders, combined as for the other pairwise judges), so preferences
    need not be transitive (rock-paper-scissors).

    Exceptions, non-finite values and values outside [0, 1] become abstentions naming why.
    """

    reads_rendered_prompt = False  # as PythonJudge: the dataset's prompt as stored
    reads_columns = False

    def __init__(
        self, fn: Callable[[Prompt, str, str], float], *, allow_abstain: bool = True, name: str = "python_pairwise"
    ):
        self.fn = fn
        self.allow_abstain = allow_abstain
        self.name = name
        self.stats = JudgeStats()

    def judge_pairs(self, items: list[tuple[Prompt, str, str]]) -> list[float | Abstain]:
        out: list[float | Abstain] = []
        for n, (prompt, a, b) in enumerate(items):
            at = dict(allow=self.allow_abstain, where=self.name, prompt=n)
            v = _call(self.fn, (prompt, a, b), self.stats, at, "P(a beats b)")
            if not isinstance(v, Abstain) and not 0.0 <= v <= 1.0:
                v = self.stats.abstain(f"out of range: P(a beats b) = {v}, expected [0, 1]", **at)
            out.append(v)
        return out

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        return preferences_both_orders(self.judge_pairs, prompts, responses, self.stats)


def _call(fn: Callable, args: tuple, stats: JudgeStats, at: dict, what: str) -> float | Abstain:
    """fn(*args) as a float; a user function's exception or a non-finite value is an
    abstention, counted in `stats` (or an error where `at` forbids abstaining)."""
    try:
        v = float(fn(*args))
    except Exception as e:  # a user function: any failure is an abstention, counted
        return stats.abstain(f"{type(e).__name__}: {e}", **at)
    if not math.isfinite(v):
        return stats.abstain(f"non-finite {what}: {v}", **at)
    return v
