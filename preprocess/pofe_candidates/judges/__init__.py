"""Judges: who scores the candidates (interface and base types in base.py).

    judge = make_judge(cfg)
    apply_judge(judge, prompts, rendered, responses, columns=..., rows=...)
    # -> judge.score(...)        scalar judges: python (function or reward_funcs), reward_model, llm
    # -> judge.preferences(...)  pairwise judges: python_pairwise, pairwise_llm, pairrm

`apply_judge` (apply.py) is how the judge stage and evaluation call a judge: it hands each
judge the prompt form and columns its flags ask for. A new judge is one module here
implementing `base.ScalarJudge` or `base.PairwiseJudge` (flags included), a `judge.type`
value in config.py, and one branch below. Heavy imports happen only for the chosen type.
"""

from __future__ import annotations

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
    """Build the configured judge."""
    if cfg.type == "python" and cfg.reward_funcs:
        from pofe_candidates.judges.reward_funcs import RewardFuncsJudge

        return RewardFuncsJudge.from_paths(
            cfg.reward_funcs,
            cfg.reward_weights,
            allow_abstain=cfg.allow_abstain,
            timeout=cfg.timeout,
            stage_timeout=cfg.stage_timeout,
        )
    if cfg.type == "python":
        from pofe_candidates.judges.base import load_function
        from pofe_candidates.judges.python import PythonJudge

        return PythonJudge(
            load_function(cfg.function),
            allow_abstain=cfg.allow_abstain,
            name=cfg.function,
            timeout=cfg.timeout,
            stage_timeout=cfg.stage_timeout,
        )
    if cfg.type == "python_pairwise":
        from pofe_candidates.judges.base import load_function
        from pofe_candidates.judges.python import PythonPairwiseJudge

        return PythonPairwiseJudge(
            load_function(cfg.function),
            allow_abstain=cfg.allow_abstain,
            name=cfg.function,
            timeout=cfg.timeout,
            stage_timeout=cfg.stage_timeout,
        )
    if cfg.type == "reward_model":
        from pofe_candidates.judges.reward_model import RewardModelJudge

        return RewardModelJudge(
            cfg.model,
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
            allow_abstain=cfg.allow_abstain,
            dtype=cfg.dtype,
            device_map=cfg.device_map,
            trust_remote_code=cfg.trust_remote_code,
            score_output=cfg.score_output,
            score_index=cfg.score_index,
            prefix_sharing=cfg.prefix_sharing,
        )
    if cfg.type in ("llm", "pairwise_llm"):
        from pofe_candidates.judges.llm import LLMRubricJudge
        from pofe_candidates.judges.pairwise import PairwiseLLMJudge
        from pofe_candidates.replicas import client_for

        cls = LLMRubricJudge if cfg.type == "llm" else PairwiseLLMJudge
        return cls(client_for(cfg), cfg)
    if cfg.type == "pairrm":
        from pofe_candidates.judges.pairrm import PairRMJudge

        # judge.max_length caps PairRM's input only when set; else the checkpoint's lengths (1224 + 2 x 412)
        max_length = cfg.max_length if "max_length" in cfg.model_fields_set else None
        return PairRMJudge.from_pretrained(
            cfg.model, batch_size=cfg.batch_size, max_length=max_length, mode=cfg.preferences
        )
    raise ValueError(f"unknown judge.type {cfg.type!r}")


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
