"""Typed config for iterated runs (`axolotl pofe run`) and their evaluation (`axolotl pofe eval`).

The `pofe.eval` block is declared here (pydantic only, no torch), so `pofe.args` can
import it cheaply; the rounds themselves are two flat keys of `PofeConfig`
(`pofe.rounds`, `pofe.round_prompts`). Decoding fields take their bounds from
`pofe.preprocess.config`, where `pofe.generate` declares the same ones.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pofe import methods
from pofe.preprocess.config import BatchSize, JudgeConfig, MaxNewTokens, Seed, Temperature, TopP

# `auto` takes the method's default (`MethodSpec.default_round_prompts`)
RoundPrompts = Literal["auto", methods.RoundPrompts]


class EvalConfig(BaseModel):
    """`pofe.eval`: held-out prompts, decoding, and an optional second judge.

    Every model of the run (pi_0 = the recipe's base_model, pi_t = round t's output) answers
    the same held-out prompts with the same seeds; the recipe's `pofe.judge` scores them
    (and `judge2`, an independent judge, when set: the guard against judge exploitation).
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    prompts: str | None = Field(
        None,
        description="A local JSON/JSONL/Parquet file of held-out prompts (column `prompt_column`; "
        "optional `reference_column` for perplexity).",
    )
    held_out: int = Field(
        0,
        ge=0,
        description="Instead of `prompts`: hold out the LAST n rows of the recipe's pofe.prompts "
        "dataset (never trained on, in any round) and evaluate on them.",
    )
    prompt_column: str = Field("prompt", description="Column holding the prompt.")
    reference_column: str = Field(
        "reference", description="Column holding a reference response (perplexity); optional."
    )
    num_samples: int = Field(4, ge=1, le=64, description="Samples per prompt and model.")
    temperature: Temperature = Field(
        1.0,
        description="0 = greedy (num_samples must be 1). The KL estimate is unbiased only at "
        "temperature 1 and top_p 1 (samples from pi_t itself).",
    )
    top_p: TopP = 1.0
    max_new_tokens: MaxNewTokens = 64
    batch_size: BatchSize = Field(16, description="Prompts per generate/score batch.")
    seed: Seed = Field(0, description="Sampling seed (the same for every model).")
    train_prompts: int = Field(
        32,
        ge=0,
        description="Also score each iterate (scalar judge) on up to n of the prompts it was "
        "trained on, for the report's 'trained model vs its candidates' (RRHF ceiling) column.",
    )
    judge2: JudgeConfig | None = Field(
        None, description="A second, independent judge for evaluation only."
    )
    cycle_threshold: float = Field(
        0.5,
        ge=0.5,
        lt=1.0,
        description="Model a 'beats' b when win[a, b] > this; the report flags 3-cycles.",
    )

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if self.prompts is None and self.held_out == 0:
            raise ValueError(
                "pofe.eval needs held-out prompts: `prompts: path/to/file.jsonl`, or "
                "`held_out: n` (the last n rows of the pofe.prompts dataset)"
            )
        if self.prompts is not None and self.held_out:
            raise ValueError("pofe.eval: set `prompts` or `held_out`, not both")
        if self.temperature == 0.0 and self.num_samples != 1:
            raise ValueError("pofe.eval.temperature: 0 (greedy) gives one answer: set num_samples: 1")
        return self
