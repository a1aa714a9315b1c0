"""Candidate generation, judging and win rates for POFE.

    from pofe_candidates import GenerateConfig, JudgeConfig, run_pipeline

Heavy modules (backends, judges, the pipeline) are imported on first use.
"""

from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig, Sampling
from pofe_candidates.win_rates import bradley_terry_preferences, symmetrize_preferences, win_rates

__all__ = [
    "win_rates",
    "symmetrize_preferences",
    "bradley_terry_preferences",
    "GenerateConfig",
    "JudgeConfig",
    "CandidatesConfig",
    "Sampling",
    "run_pipeline",
    "PipelineResult",
    "make_generator",
    "make_judge",
    "Abstain",
]

_LAZY = {
    "run_pipeline": ".pipeline",
    "PipelineResult": ".pipeline",
    "make_generator": ".generators",
    "make_judge": ".judges",
    "Abstain": ".judges",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'pofe_candidates' has no attribute {name!r}")
