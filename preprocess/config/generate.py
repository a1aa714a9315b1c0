"""`pofe.generate`: who writes the k candidates per prompt, and how they are decoded."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pofe.methods import method_spec

from .base import (
    STRATEGY_BACKENDS,
    Backend,
    BatchSize,
    MaxNewTokens,
    Sampling,
    Seed,
    Strategy,
    Temperature,
    TopP,
    StrictConfig,
)
from .credentials import check_base_url, check_key_env


class GenerateConfig(StrictConfig):
    """How candidates are generated for each prompt."""

    backend: Backend = Field(
        "transformers",
        description="vllm (in process), openai (any OpenAI-compatible /v1/completions server, "
        "e.g. `vllm serve`), or transformers (`model.generate`, slow but always available).",
    )
    model: str | None = Field(
        None,
        description="Model path or served model name. Defaults to the policy (base_model) path.",
    )
    base_url: str | None = Field(
        None, description="openai backend: server root, e.g. http://127.0.0.1:8000/v1."
    )
    api_key_env: str | None = Field(
        None,
        description="Name of the environment variable holding the API key (the key itself is "
        "never written to config, logs or outputs).",
    )
    num_candidates: int = Field(4, ge=1, le=64, description="Model candidates per prompt (k).")
    strategy: Strategy = Field("sample", description="sample | beam | diverse_beam.")
    temperature: Temperature = 0.8
    top_p: TopP = 1.0
    top_k: int = Field(0, ge=0, description="Top-k sampling; 0 disables it.")
    max_new_tokens: MaxNewTokens = 128
    num_beam_groups: int = Field(
        1, ge=1, le=64, description="diverse_beam: number of groups (paper: 4)."
    )
    diversity_penalty: float = Field(
        1.0, ge=0.0, le=100.0, description="diverse_beam: Hamming diversity penalty (paper: 1.0)."
    )
    seed: Seed = 0
    include_dataset_responses: list[str] = Field(
        default_factory=list,
        description="Dataset columns whose text is added as extra candidates (RRHF paper: the "
        "dataset's human responses). A column may hold a string or a list of strings.",
    )
    dedupe: bool | None = Field(
        None,
        description="Drop exact and near-duplicate candidates (case/space/punctuation). None: the "
        "method's default (pofe.methods: on for RRHF, off for SPPO, which keeps all K samples).",
    )
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Rendered prompt length limit in tokens; None = no limit."
    )
    prompt_overflow: Literal["truncate", "drop"] = Field(
        "drop",
        description="Over-long prompts: drop the row (counted) or keep its LAST tokens.",
    )
    batch_size: BatchSize = 8
    request_timeout: float = Field(
        120.0, gt=0.0, le=3600.0, description="openai: seconds per try, connect to last byte."
    )
    max_retries: int = Field(
        4, ge=0, le=20,
        description="openai: retries after the first try (Retry-After, else jittered exponential back-off).",
    )
    vllm_kwargs: dict = Field(
        default_factory=dict,
        description="vllm: extra keyword arguments for vllm.LLM (dtype, max_model_len, ...).",
    )

    @model_validator(mode="after")
    def _check(self) -> GenerateConfig:
        allowed = STRATEGY_BACKENDS[self.strategy]
        if self.backend not in allowed:
            raise ValueError(
                f"generate.strategy={self.strategy!r} is not supported by backend "
                f"{self.backend!r}; backends that support it: {', '.join(allowed)}. "
                "Use strategy: sample, or switch backend."
            )
        if self.backend == "openai" and not self.base_url:
            raise ValueError(
                "generate.backend=openai needs generate.base_url (e.g. http://127.0.0.1:8000/v1)."
            )
        if self.strategy == "diverse_beam":
            if self.num_beam_groups < 2:
                raise ValueError("generate.strategy=diverse_beam needs num_beam_groups >= 2.")
            if self.num_candidates % self.num_beam_groups:
                raise ValueError(
                    f"generate.num_candidates={self.num_candidates} must be a multiple of "
                    f"num_beam_groups={self.num_beam_groups} (each group returns "
                    "num_candidates / num_beam_groups beams)."
                )
        check_key_env(self.api_key_env, "generate")
        check_base_url(self.base_url, "generate")
        return self

    def for_method(self, method: str) -> GenerateConfig:
        """This config with `dedupe` resolved: as set, else the method's default."""
        if self.dedupe is not None:
            return self
        return self.model_copy(update={"dedupe": method_spec(method).dedupe_candidates})

    def sampling(self) -> Sampling:
        return Sampling(
            strategy=self.strategy,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            num_beam_groups=self.num_beam_groups,
            diversity_penalty=self.diversity_penalty,
            seed=self.seed,
        )

    def public_dict(self) -> dict:
        """Settings to record in summary.json (no secrets: only the env var's name)."""
        return self.model_dump()
