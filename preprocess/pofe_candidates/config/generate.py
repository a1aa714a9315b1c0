"""`pofe.generate`: who writes the k candidates per prompt, and how they are decoded."""

from __future__ import annotations

import shlex
from string import Formatter
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pofe.methods import method_spec
from pofe_candidates.config.credentials import check_base_url, check_key_env, check_serve_env, redact
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
from pofe_candidates.config.strict import StrictConfig

# What POFE fills into generate.serve.command for each stage's policy. `lora_modules` stands
# alone as a word and becomes several (vLLM's `--enable-lora --lora-modules NAME=PATH
# [--max-lora-rank R]`), or none when the policy is a full model.
SERVE_PLACEHOLDERS = ("model", "port", "host", "served_model_name", "lora_modules", "tensor_parallel_size")
SERVE_REQUIRED = ("model", "port")
# serve keys that decide how the server is reached and waited for, not what it generates: a
# stage resumed with other values reuses its shards (generate/manifest.json leaves them out)
SERVE_RUNTIME_KEYS = frozenset({"host", "port", "ready_timeout", "stop_timeout"})


class ServeConfig(StrictConfig):
    """A server POFE starts for the stage's policy, waits for, generates from and stops."""

    command: str = Field(
        ...,
        min_length=1,
        description="Command line of an OpenAI-compatible server, with placeholders POFE fills: "
        "{model} (the policy's path; an adapter's base), {port}, {host}, {served_model_name}, "
        "{lora_modules} (vLLM's LoRA flags when the policy is an adapter, else nothing), "
        "{tensor_parallel_size}. {model} and {port} are required.",
    )
    host: str = Field("127.0.0.1", min_length=1, description="Address the server binds and POFE calls.")
    port: int = Field(0, ge=0, le=65535, description="Port for the server; 0 = a free one, picked at start.")
    served_model_name: str = Field(
        "policy",
        min_length=1,
        description="Name requests use: the served model's ({served_model_name}) or the LoRA module's.",
    )
    tensor_parallel_size: int = Field(1, ge=1, le=1024, description="Filled into {tensor_parallel_size}.")
    ready_timeout: float = Field(
        600.0, gt=0.0, le=86400.0, description="Seconds to wait for the server's /models to answer."
    )
    stop_timeout: float = Field(
        30.0, gt=0.0, le=3600.0, description="Seconds between SIGTERM and SIGKILL when stopping the server."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables for the server (e.g. VLLM_CPU_KVCACHE_SPACE), on top of "
        "POFE's own, which it inherits. No secrets: `NAME: ${OTHER}` passes POFE's variable OTHER through "
        "(read when the server starts, written nowhere); a literal value for a secret-named variable "
        "(*_KEY, *_TOKEN, ...) or one that looks like a key is refused.",
    )

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        check_serve_env(env)
        return env

    @field_validator("command")
    @classmethod
    def _check_command(cls, command: str) -> str:
        try:
            words = shlex.split(command)
        except ValueError as e:
            raise ValueError(f"generate.serve.command is not a valid shell-quoted command line: {e}") from e
        names = [name for word in words for _, name, _, _ in Formatter().parse(word) if name is not None]
        unknown = sorted({n for n in names if n not in SERVE_PLACEHOLDERS})
        if unknown:
            raise ValueError(
                f"generate.serve.command has unknown placeholder(s) {unknown}; known: "
                f"{', '.join('{' + p + '}' for p in SERVE_PLACEHOLDERS)} (write {{{{ and }}}} for literal braces)."
            )
        missing = [n for n in SERVE_REQUIRED if n not in names]
        if missing:
            raise ValueError(
                f"generate.serve.command must contain {', '.join('{' + n + '}' for n in missing)}: POFE serves "
                "each stage's policy on a port it chooses (e.g. `... --model {model} --port {port}`)."
            )
        if "lora_modules" in names and "{lora_modules}" not in words:
            raise ValueError(
                "generate.serve.command: {lora_modules} must be a word of its own (it becomes several "
                "arguments), e.g. `... --port {port} {lora_modules} --dtype float32`."
            )
        return command


class GenerateConfig(StrictConfig):
    """How candidates are generated for each prompt."""

    backend: Backend = Field(
        "transformers",
        description="vllm (in process), openai (any OpenAI-compatible /v1/completions server, "
        "e.g. `vllm serve`), or transformers (`model.generate`, slow but always available).",
    )
    model: str | None = Field(
        None,
        description="Model path or served model name (with serve: the path served, a full model or a "
        "PEFT adapter). Defaults to the policy (base_model) path.",
    )
    base_url: str | list[str] | None = Field(
        None,
        description="openai backend: server root, e.g. http://127.0.0.1:8000/v1; or a list of "
        "servers (replicas serving the same model): requests are spread over them, and those of a "
        "server that fails are sent to the others.",
    )
    serve: ServeConfig | None = Field(
        None,
        description="openai backend: start a server for each stage's policy from this command (instead "
        "of base_url), generate, and stop it; iterated runs (pofe.rounds > 1) need it.",
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
    num_beam_groups: int = Field(1, ge=1, le=64, description="diverse_beam: number of groups (paper: 4).")
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
        description="Over-long prompts: drop the row (counted), or cut their oldest whole turns (system kept; "
        "dropped when the last user turn alone is too long). The rows carry the turns kept.",
    )
    openai_prompt: Literal["token_ids", "text"] = Field(
        "token_ids",
        description="openai: what /v1/completions gets as the prompt: the trainer's token ids (vLLM, "
        "SGLang), or the rendered text with add_special_tokens: false (vLLM's extension). Either way "
        "POFE checks the server's prompt token count and refuses one that added a token (a second BOS).",
    )
    batch_size: BatchSize = 8
    in_flight: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="vllm / openai: prompts in flight for the whole stage, across shard boundaries (each "
        "with num_candidates samples); finished shards are written as they complete. None: vllm, the "
        "engine's max_num_seqs; openai with serve, the command's --max-num-seqs (else 256); openai with "
        "base_url, per server: 256 for a vLLM server (its /v1/models says so), else 32.",
    )
    request_timeout: float = Field(
        120.0, gt=0.0, le=3600.0, description="openai: seconds per try, connect to last byte."
    )
    max_retries: int = Field(
        4,
        ge=0,
        le=20,
        description="openai: retries after the first try (Retry-After, else jittered exponential back-off).",
    )
    vllm_kwargs: dict = Field(
        default_factory=dict,
        description="vllm: extra keyword arguments for vllm.LLM (dtype, max_model_len, ...). "
        "tensor_parallel_size and pipeline_parallel_size split one engine over that many GPUs (with "
        "pofe.candidates.num_workers, each worker takes a group of tensor x pipeline GPUs); "
        "data_parallel_size is refused: set pofe.candidates.num_workers (one engine per worker).",
    )

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, url: str | list[str] | None) -> str | list[str] | None:
        check_base_url(url, "generate")  # before the backend's checks: an empty list is not "no server"
        return url

    @model_validator(mode="after")
    def _check(self) -> GenerateConfig:
        allowed = STRATEGY_BACKENDS[self.strategy]
        if self.backend not in allowed:
            raise ValueError(
                f"generate.strategy={self.strategy!r} is not supported by backend "
                f"{self.backend!r}; backends that support it: {', '.join(allowed)}. "
                "Use strategy: sample, or switch backend."
            )
        if self.serve is not None and self.backend != "openai":
            raise ValueError(
                f"generate.serve starts an OpenAI-compatible server: it needs generate.backend: openai, "
                f"got {self.backend!r}."
            )
        if self.serve is not None and self.base_url:
            raise ValueError(
                "generate.serve and generate.base_url are both set: with serve, POFE starts the server "
                "and derives the URL from serve.host and serve.port; remove base_url."
            )
        if self.backend == "openai" and not self.base_url and self.serve is None:
            raise ValueError(
                "generate.backend=openai needs generate.base_url (e.g. http://127.0.0.1:8000/v1), or "
                "generate.serve (a server command POFE starts for the policy)."
            )
        # against the default, not fields_set: a dumped config (every field set) validates again
        if self.backend == "openai" and self.batch_size != GenerateConfig.model_fields["batch_size"].default:
            servers = len(self.base_url) if isinstance(self.base_url, list) else 1
            raise ValueError(
                "generate.batch_size applies to backend: transformers; the openai backend keeps "
                "generate.in_flight prompts in flight (default: the --max-num-seqs of a served policy; with "
                f"base_url, 256 per vLLM server, 32 per other server): set generate.in_flight: "
                f"{self.batch_size * servers} instead (batch_size per server was the window before)."
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
        if self.strategy == "sample" and self.num_candidates > 1 and (self.temperature == 0 or self.top_k == 1):
            # greedy decoding: the k samples of a prompt would be one text k times, which looks
            # like a judge that cannot tell candidates apart
            greedy = "temperature: 0" if self.temperature == 0 else "top_k: 1"
            raise ValueError(
                f"generate.{greedy} is greedy decoding: all num_candidates={self.num_candidates} samples of a "
                "prompt would be the same text. Sample (e.g. temperature: 0.8), use strategy: beam or "
                "diverse_beam for distinct greedy-like candidates, or set num_candidates: 1."
            )
        check_key_env(self.api_key_env, "generate")
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
        """Settings to record in summary.json: no secrets (only the key's env var name, and
        serve.command's keys masked by `redact`)."""
        return redact(self.model_dump())
