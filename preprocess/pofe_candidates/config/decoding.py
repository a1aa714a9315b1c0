"""Decoding settings: the backends and strategies, the field types `GenerateConfig` and the run
layer's `EvalConfig` share, and the `Sampling` settings a generation backend receives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

Backend = Literal["vllm", "openai", "transformers"]
Strategy = Literal["sample", "beam", "diverse_beam"]

# Which backends can decode each strategy. The OpenAI completions API has no beam search;
# vLLM has no group (diverse) beam search and POFE does not wire its separate `beam_search`
# API yet; transformers does all three (diverse beam via POFE's own logits processor,
# see generators/diverse_beam.py).
STRATEGY_BACKENDS: dict[str, tuple[str, ...]] = {
    "sample": ("vllm", "openai", "transformers"),
    "beam": ("transformers",),
    "diverse_beam": ("transformers",),
}

# Decoding settings shared by `GenerateConfig` and the run layer's `EvalConfig`: bounds and
# meaning declared once, each block choosing its own default (`temperature: Temperature = 0.8`).
Temperature = Annotated[float, Field(ge=0.0, le=5.0, description="Sampling temperature; 0 = greedy.")]
TopP = Annotated[float, Field(gt=0.0, le=1.0, description="Nucleus sampling mass.")]
MaxNewTokens = Annotated[int, Field(ge=1, le=32768, description="Tokens per response.")]
Seed = Annotated[int, Field(ge=0, description="Base seed; same seed and inputs -> same responses.")]
BatchSize = Annotated[int, Field(ge=1, le=4096, description="Prompts per batch (or per backend call).")]


@dataclass(frozen=True)
class Sampling:
    """The decoding settings a backend needs, detached from the rest of the config.

    `seed` is a base seed: the pipeline passes `seed + prompt_index` (or per shard) so a
    resumed run regenerates exactly what an uninterrupted one would.
    """

    strategy: Strategy = "sample"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    num_beam_groups: int = 1
    diversity_penalty: float = 0.0
    seed: int = 0
