"""Typed configuration for building candidate datasets from prompts.

Three blocks, each declared once and validated up front (before any model loads):

- `GenerateConfig`: who writes the k candidates per prompt, and how they are decoded.
- `JudgeConfig`: who scores them (scalar judges for RRHF rewards or Bradley-Terry win rates,
  pairwise judges for SPPO preference matrices).
- `PipelineConfig`: where shards and the final dataset go, shard size, what SPPO keeps.

These are the `pofe.generate` / `pofe.judge` blocks of the YAML. API keys are never stored:
only the NAME of the environment variable that holds one (`api_key_env`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pofe.methods import method_spec

Backend = Literal["vllm", "openai", "transformers"]
Strategy = Literal["sample", "beam", "diverse_beam"]
JudgeType = Literal["python", "python_pairwise", "reward_model", "llm", "pairwise_llm", "pairrm"]
Preferences = Literal["bradley_terry", "hard", "both_orders", "authors"]  # formulas: win_rates.py, pairrm.py

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

SCALAR_JUDGES = ("python", "reward_model", "llm")
PAIRWISE_JUDGES = ("python_pairwise", "pairwise_llm", "pairrm")
FUNCTION_JUDGES = ("python", "python_pairwise")  # call judge.function (imported before generating)
# `judge.preferences` each judge accepts, its default first. "authors" (the SPPO scripts') needs
# PairRM's logits; the other pairwise judges give probabilities, which "both_orders" combines.
JUDGE_PREFERENCES: dict[str, tuple[str, ...]] = {
    **{t: ("bradley_terry", "hard") for t in SCALAR_JUDGES},
    **{t: ("both_orders",) for t in ("python_pairwise", "pairwise_llm")},
    "pairrm": ("authors", "both_orders"),
}


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


class _Strict(BaseModel):
    # Unknown keys are typos: fail and name them instead of silently ignoring them. Errors
    # never repeat the input: it may be a key pasted where it does not belong (`api_key:`).
    model_config = ConfigDict(extra="forbid", protected_namespaces=(), hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _no_inline_key(cls, data):
        if isinstance(data, dict) and "api_key" in data:
            raise ValueError(
                "api_key: keys are never read from the config (it is written to logs and "
                "outputs); put the key in an environment variable and set api_key_env to that "
                "variable's name."
            )
        return data


class GenerateConfig(_Strict):
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
        _check_key_env(self.api_key_env, "generate")
        _check_base_url(self.base_url, "generate")
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


class JudgeConfig(_Strict):
    """Who scores the candidates.

    Scalar judges (python, reward_model, llm) give one reward per candidate: RRHF uses them
    directly; SPPO turns them into win rates by `preferences` (bradley_terry or hard; transitive
    by construction). Pairwise judges (python_pairwise, pairwise_llm, pairrm) give a K x K
    preference matrix: SPPO only (RRHF needs a scalar reward per candidate).
    """

    type: JudgeType = Field("python", description="python | python_pairwise | reward_model | llm | pairwise_llm | pairrm.")
    function: str | None = Field(
        None,
        description="python: 'module:function'(prompt, response) -> float; python_pairwise: (prompt, "
        "response_a, response_b) -> P(a beats b) in [0, 1]. prompt: the dataset's (str or messages).",
    )
    preferences: Preferences | None = Field(
        None,
        description="SPPO: verdicts -> preference matrix. Scalar judges: bradley_terry (default; "
        "sigmoid((r_i - r_j) / T)) or hard (1, 1/2 on a tie, 0); pairrm: authors (default) or "
        "both_orders; python_pairwise, pairwise_llm: both_orders. None: the judge's default.",
    )
    preferences_temperature: float = Field(1.0, gt=0.0, le=1e6, description="bradley_terry: the reward scale T.")
    model: str | None = Field(
        None, description="reward_model / pairrm: local path or hub id; llm judges: served model name."
    )
    base_url: str | None = Field(None, description="llm judges: OpenAI-compatible server root (.../v1).")
    api_key_env: str | None = Field(None, description="Name of the env var holding the API key.")
    rubric: str | None = Field(
        None,
        description="llm: prompt template with {prompt} and {response}; pairwise_llm: with "
        "{prompt}, {response_a}, {response_b}. Default templates are used if unset.",
    )
    score_range: tuple[float, float] = Field(
        (1.0, 10.0), description="llm: the score scale the rubric asks for; out-of-range = abstain."
    )
    use_logprobs: bool = Field(
        True,
        description="pairwise_llm: read P(A) from the verdict tokens' logprobs when the server "
        "returns them, else parse the verdict from text.",
    )
    batch_size: int = Field(8, ge=1, le=4096, description="Candidates (or pairs) per forward / request batch.")
    max_length: int = Field(1024, ge=8, le=131072, description="reward_model/pairrm: tokens per input.")
    allow_abstain: bool = Field(
        True,
        description="Treat unparseable verdicts/failed calls as abstentions (counted, candidate "
        "or pair skipped). False: the first one stops the run with the offending row.",
    )
    max_abstention_rate: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Stop the run when more than this share of verdicts (candidates, or pairs for "
        "a pairwise judge) abstained; a run where every verdict abstained always stops.",
    )
    request_timeout: float = Field(120.0, gt=0.0, le=3600.0, description="llm judges: seconds per try, connect to last byte.")
    max_retries: int = Field(4, ge=0, le=20, description="llm judges: retries per request.")
    max_new_tokens: int = Field(16, ge=1, le=4096, description="llm judges: verdict length.")

    @model_validator(mode="after")
    def _check(self) -> JudgeConfig:
        if self.type in FUNCTION_JUDGES and (not self.function or ":" not in self.function):
            raise ValueError(
                f"judge.type={self.type} needs judge.function: 'module:function' "
                "(e.g. pofe.demo.task:reward)."
            )
        allowed = JUDGE_PREFERENCES[self.type]
        if self.preferences is None:
            self.preferences = allowed[0]
        elif self.preferences not in allowed:
            raise ValueError(f"judge.preferences: {self.preferences} does not apply to judge.type: {self.type}; "
                             f"it takes {' or '.join(allowed)}.")
        # against the default, not fields_set: a dumped config (every field set) validates again
        if self.preferences_temperature != JudgeConfig.model_fields["preferences_temperature"].default \
                and self.preferences != "bradley_terry":
            raise ValueError(f"judge.preferences_temperature applies to preferences: bradley_terry only "
                             f"(judge.type: {self.type} forms them by {self.preferences}); remove it.")
        if self.type in ("reward_model", "pairrm") and not self.model:
            raise ValueError(f"judge.type={self.type} needs judge.model (a local path or hub id).")
        if self.type in ("llm", "pairwise_llm") and not self.base_url:
            raise ValueError(
                f"judge.type={self.type} needs judge.base_url (an OpenAI-compatible server, "
                "e.g. http://127.0.0.1:8000/v1)."
            )
        lo, hi = self.score_range
        if not lo < hi:
            raise ValueError(f"judge.score_range must be (low, high) with low < high, got {self.score_range}.")
        _check_key_env(self.api_key_env, "judge")
        _check_base_url(self.base_url, "judge")
        return self

    @property
    def is_pairwise(self) -> bool:
        return self.type in PAIRWISE_JUDGES


class PipelineConfig(_Strict):
    """Where and how the pipeline writes."""

    out_dir: str | None = Field(
        None,
        description="Directory for shards, data.jsonl and summary.json (default: under "
        "dataset_prepared_path, named by a hash of the inputs and settings).",
    )
    shard_size: int = Field(64, ge=1, le=1_000_000, description="Prompts per shard (unit of resume).")
    keep: Literal["all", "best_worst"] = Field(
        "all",
        description="sppo: keep every candidate, or only the highest- and lowest-win-rate one "
        "(the SPPO paper's data-budget choice).",
    )
    min_candidates: int = Field(2, ge=2, description="Rows with fewer judged candidates are dropped (counted).")
    truncated: Literal["drop", "keep"] | None = Field(
        None,
        description="Candidates cut at generate.max_new_tokens (finish reason `length`): drop them "
        "(counted in summary.json's truncated_candidates_dropped) or keep them (trained as if "
        "finished: the end-of-turn token is appended). None: the method's default (pofe.methods: "
        "keep for RRHF and SPPO, as their authors' scripts do).",
    )
    progress: bool = Field(True, description="Show tqdm progress bars.")

    def for_method(self, method: str) -> PipelineConfig:
        """This config with `truncated` resolved: as set, else the method's default."""
        if self.truncated is not None:
            return self
        return self.model_copy(update={"truncated": method_spec(method).truncated_candidates})


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Prefixes of common API keys (OpenAI, Hugging Face, GitHub, Groq, Replicate, xAI).
_KEY_PREFIXES = ("sk-", "sk_", "hf_", "ghp_", "gho_", "github_pat_", "gsk_", "r8_", "xai-")


def looks_like_key(value: str) -> bool:
    """A known key prefix on a long value, or 24+ letters and digits with no '_' between words
    (variable names are words joined by '_'; keys are random characters)."""
    if value.startswith(_KEY_PREFIXES) and len(value) >= 20:
        return True
    return (
        len(value) >= 24
        and "_" not in value
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
    )


def _check_key_env(name: str | None, block: str) -> None:
    # A key pasted where the variable NAME belongs would end up in logs, summary.json and
    # the config dump: refuse it, and never repeat it in the error.
    if name is None:
        return
    if looks_like_key(name):
        raise ValueError(
            f"{block}.api_key_env looks like an API key, not the NAME of an environment variable "
            "(its value is not repeated here). Put the key in an environment variable "
            f"(export OPENAI_API_KEY=...) and set {block}.api_key_env: OPENAI_API_KEY."
        )
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(
            f"{block}.api_key_env must be the NAME of an environment variable: letters, digits "
            "and '_', not starting with a digit, e.g. OPENAI_API_KEY (the value given is not "
            "repeated here, in case it is a key)."
        )


def redact_url(url: str) -> str:
    """`url` with any `user:password@` replaced by `***@`."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _check_base_url(url: str | None, block: str) -> None:
    # Credentials in the URL would be written wherever the URL is (errors, logs, manifest,
    # summary, config dump): refuse them; the key goes in an environment variable.
    if url is not None and "@" in urlsplit(url).netloc:
        raise ValueError(
            f"{block}.base_url must not contain credentials (user:password@host), got "
            f"{redact_url(url)}: the URL is written to logs and outputs. Remove them, put the key in "
            f"an environment variable and set {block}.api_key_env to its name (the key is sent as "
            "`Authorization: Bearer <key>`)."
        )


def read_api_key(name: str | None) -> str | None:
    """The key from the named env var (None if no name). Raises if the variable is unset."""
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise ValueError(f"api_key_env={name!r} names an environment variable that is not set.")
    return key
