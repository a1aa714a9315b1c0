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
from pofe_candidates.judges.interface import (
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
from pofe_candidates.judges.user_functions import load_dotted, load_function


def make_judge(cfg: JudgeConfig) -> ScalarJudge | PairwiseJudge:
    """Build the configured judge: its type's factory (`JudgeSpec.factory`, "module:attr[.attr]"),
    imported now, called with the config."""
    module, _, path = cfg.spec.factory.partition(":")
    factory = functools.reduce(getattr, path.split("."), importlib.import_module(module))
    return factory(cfg)


def import_judge_functions(cfg: JudgeConfig) -> None:
    """A function judge's Python imported now (`judge.function`, each of `judge.reward_funcs`), as
    building it does: a module that fails to import or a name that is no function is an error naming
    the file and line when the recipe is read, not when the judge is first built (an online run's
    first refresh, after the model loaded). Other judges load models or reach servers: not here."""
    if cfg.function:
        load_function(cfg.function)
    for path in cfg.reward_funcs or []:
        load_dotted(path, "judge.reward_funcs")


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
    "import_judge_functions",
    "is_pairwise",
    "make_judge",
]
