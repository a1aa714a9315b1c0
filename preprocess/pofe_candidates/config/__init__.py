"""Typed configuration for building candidate datasets from prompts.

Three blocks, each declared once and validated up front (before any model loads):

- `GenerateConfig`: who writes the k candidates per prompt, and how they are decoded.
- `JudgeConfig`: who scores them (scalar judges for RRHF rewards or Bradley-Terry win rates,
  pairwise judges for SPPO preference matrices); each `judge.type` a `JudgeSpec` in the judge
  registry (`judge_kinds`, `register_judge`).
- `CandidatesConfig`: where shards and the final dataset go, shard size, what SPPO keeps.

These are the `pofe.generate`, `pofe.judge` and `pofe.candidates` blocks of the YAML. API keys are never stored:
only the NAME of the environment variable that holds one (`api_key_env`).
"""

from pofe_candidates.config.candidates import CandidatesConfig
from pofe_candidates.config.credentials import (
    looks_like_key,
    read_api_key,
    redact,
    redact_text,
    redact_url,
    resolve_env,
)
from pofe_candidates.config.decoding import (
    STRATEGY_BACKENDS,
    Backend,
    BatchSize,
    MaxNewTokens,
    Sampling,
    Seed,
    Strategy,
    Temperature,
    TopP,
)
from pofe_candidates.config.generate import GenerateConfig
from pofe_candidates.config.judge import JudgeConfig
from pofe_candidates.config.judge_kinds import JUDGES, JudgeSpec, judge_spec, register_judge
from pofe_candidates.config.rubric import fill_rubric

__all__ = [
    "BatchSize",
    "Backend",
    "GenerateConfig",
    "JUDGES",
    "JudgeConfig",
    "JudgeSpec",
    "MaxNewTokens",
    "CandidatesConfig",
    "STRATEGY_BACKENDS",
    "Sampling",
    "Seed",
    "Strategy",
    "Temperature",
    "TopP",
    "fill_rubric",
    "judge_spec",
    "looks_like_key",
    "read_api_key",
    "redact",
    "redact_text",
    "redact_url",
    "register_judge",
    "resolve_env",
]
