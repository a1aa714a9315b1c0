"""Python judge: a user function `module:function(prompt, response) -> float`."""

from __future__ import annotations

import math
from typing import Callable

from ..render import Prompt
from .base import JudgeStats, Score


class PythonJudge:
    """`module:function(prompt, response) -> float`, called once per candidate.

    `prompt` is the dataset's prompt as stored (a string or chat messages). Exceptions and
    non-finite results become abstentions naming the exception.
    """

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
                try:
                    v = float(self.fn(prompt, resp))
                except Exception as e:  # a user function: any failure is an abstention, counted
                    row.append(self.stats.abstain(f"{type(e).__name__}: {e}", **at))
                    continue
                if not math.isfinite(v):
                    row.append(self.stats.abstain(f"non-finite score: {v}", **at))
                    continue
                row.append(v)
            out.append(row)
        return out
