"""Shared pieces of the preprocessing config: decoding field types, the strict base model,
and the `Sampling` settings a generation backend receives."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


def check_keys(data: dict[str, Any], known: Iterable[str]) -> None:
    """Refuse the keys of `data` not in `known`, each named with the nearest known key
    (difflib's, as Python's own "did you mean" picks one), else with the keys there are."""
    known = list(known)
    unknown = [key for key in data if key not in known]
    if not unknown:
        return
    said = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), known, n=1)
        said.append(f"{key!r} (did you mean {near[0]!r}?)" if near else repr(key))
    hint = "" if all("did you mean" in s for s in said) else f"; the keys here: {', '.join(sorted(known))}"
    raise ValueError(f"unknown key{'s' * (len(unknown) > 1)} {', '.join(said)}{hint}")


class KnownKeys(BaseModel):
    """A config block whose unknown keys are typos: refused, each named with the nearest key,
    instead of pydantic's "Extra inputs are not permitted"."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            check_keys(data, cls.model_fields)
        return data


class StrictConfig(KnownKeys):
    # Errors never repeat the input: it may be a key pasted where it does not belong (`api_key:`).
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                "api_key: keys are never read from the config (it is written to logs and "
                "outputs); put the key in an environment variable and set api_key_env to that "
                "variable's name."
            )
        if isinstance(data, dict):
            check_keys(data, cls.model_fields)
        return data
