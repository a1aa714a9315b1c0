"""Judges: who scores the candidates (interface and base types in base.py).

    judge = make_judge(cfg)
    apply_judge(judge, prompts, rendered, responses, columns=..., rows=...)
    # -> judge.score(...)        scalar judges: python (function or reward_funcs), reward_model, llm
    # -> judge.preferences(...)  pairwise judges: python_pairwise, pairwise_llm, pairrm, gpm

`apply_judge` (apply.py) is how the judge stage and evaluation call a judge: it hands each
judge the prompt form and columns its flags ask for. A new judge is one module here
implementing `base.ScalarJudge` or `base.PairwiseJudge` (flags included) and a factory taking
the `JudgeConfig`, and a `JudgeSpec` naming that factory in the judge registry
(`pofe_candidates.config.judge_kinds`). Heavy imports happen only for the chosen type.
"""

from __future__ import annotations

import functools
import importlib

from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges.apply import apply_judge
from pofe_candidates.judges.base import (
    Abstain,
    JudgeError,
    JudgeStats,
    PairwiseJudge,
    PairwiseVerdict,
    PromptCut,
    ScalarJudge,
    Score,
    is_pairwise,
)


def make_judge(cfg: JudgeConfig) -> ScalarJudge | PairwiseJudge:
    """Build the configured judge: its type's factory (`JudgeSpec.factory`, "module:attr[.attr]"),
    imported now, called with the config."""
    module, _, path = cfg.spec.factory.partition(":")
    factory = functools.reduce(getattr, path.split("."), importlib.import_module(module))
    return factory(cfg)


__all__ = [
    "Abstain",
    "JudgeError",
    "JudgeStats",
    "PairwiseJudge",
    "PairwiseVerdict",
    "PromptCut",
    "ScalarJudge",
    "Score",
    "apply_judge",
    "is_pairwise",
    "make_judge",
]
