"""Typed configuration for building candidate datasets from prompts.

Three blocks, each declared once and validated up front (before any model loads):

- `GenerateConfig`: who writes the k candidates per prompt, and how they are decoded.
- `JudgeConfig`: who scores them (scalar judges for RRHF rewards or Bradley-Terry win rates,
  pairwise judges for SPPO preference matrices).
- `CandidatesConfig`: where shards and the final dataset go, shard size, what SPPO keeps.

These are the `pofe.generate`, `pofe.judge` and `pofe.candidates` blocks of the YAML. API keys are never stored:
only the NAME of the environment variable that holds one (`api_key_env`).
"""

from pofe_candidates.config.base import (
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
from pofe_candidates.config.candidates import CandidatesConfig
from pofe_candidates.config.credentials import (
    looks_like_key,
    read_api_key,
    redact,
    redact_text,
    redact_url,
    resolve_env,
)
from pofe_candidates.config.generate import GenerateConfig
from pofe_candidates.config.judge import (
    FUNCTION_JUDGES,
    JUDGE_PREFERENCES,
    PAIRWISE_JUDGES,
    SCALAR_JUDGES,
    JudgeConfig,
)

__all__ = [
    "BatchSize",
    "Backend",
    "FUNCTION_JUDGES",
    "GenerateConfig",
    "JUDGE_PREFERENCES",
    "JudgeConfig",
    "MaxNewTokens",
    "PAIRWISE_JUDGES",
    "CandidatesConfig",
    "SCALAR_JUDGES",
    "STRATEGY_BACKENDS",
    "Sampling",
    "Seed",
    "Strategy",
    "Temperature",
    "TopP",
    "looks_like_key",
    "read_api_key",
    "redact",
    "redact_text",
    "redact_url",
    "resolve_env",
]
