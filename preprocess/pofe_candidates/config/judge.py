"""`pofe.judge`: who scores the candidates, and how verdicts become SPPO preferences.

One flat block of keys; which of them a `judge.type` reads, needs and checks is its spec's in
the judge registry (`judge_kinds`), asked by `JudgeConfig`'s validator.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pofe_candidates.config.credentials import check_base_url, check_key_env
from pofe_candidates.config.judge_kinds import JudgeSpec, check_judge_keys, judge_spec
from pofe_candidates.config.strict import StrictConfig

# formulas: win_rates.py, judges/pairrm.py, judges/gpm.py; which a judge.type takes: its spec
Preferences = Literal["bradley_terry", "hard", "both_orders", "authors", "probability"]
RewardModelDtype = Literal["auto", "float32", "bfloat16", "float16"]


class JudgeConfig(StrictConfig):
    """Who scores the candidates.

    Scalar judges (python, reward_model, llm) give one reward per candidate: RRHF uses them
    directly; SPPO turns them into win rates by `preferences` (bradley_terry or hard; transitive
    by construction). Pairwise judges (python_pairwise, pairwise_llm, pairrm, gpm) give a K x K
    preference matrix: SPPO only (RRHF needs a scalar reward per candidate). `spec` is the
    type's entry in the judge registry.
    """

    type: str = Field(
        "python",
        description="A registered judge type: python | python_pairwise | reward_model | llm | pairwise_llm | "
        "pairrm | gpm, or one a plugin registers (`register_judge`).",
    )
    function: str | None = Field(
        None,
        description="python: 'module:function'(prompt, response) -> float; python_pairwise: (prompt, "
        "response_a, response_b) -> P(a beats b) in [0, 1]. prompt: the dataset's (str or messages).",
    )
    reward_funcs: list[str] | None = Field(
        None,
        min_length=1,
        description="python, instead of function: TRL / axolotl GRPO-style batched reward functions, "
        "dotted paths 'package.module.function'(prompts, completions, **kwargs) -> list[float | None] "
        "(kwargs: the dataset row's other columns, one value per completion). None: that function "
        "abstains for that completion.",
    )
    reward_weights: list[float] | None = Field(
        None,
        min_length=1,
        description="reward_funcs: one weight per function (default 1.0 each). Reward = sum of weight x "
        "value over the functions that gave a value (TRL's nansum); none gave one: an abstention.",
    )
    preferences: Preferences | None = Field(
        None,
        description="SPPO: verdicts -> preference matrix. Scalar judges: bradley_terry (default; "
        "sigmoid((r_i - r_j) / T)) or hard (1, 1/2 on a tie, 0); pairrm: authors (default) or "
        "both_orders; gpm: probability (default) or authors; python_pairwise, pairwise_llm: both_orders. "
        "None: the judge's default.",
    )
    preferences_temperature: float = Field(1.0, gt=0.0, le=1e6, description="bradley_terry: the reward scale T.")
    model: str | None = Field(
        None, description="reward_model / pairrm / gpm: local path or hub id; llm judges: served model name."
    )
    base_url: str | list[str] | None = Field(
        None,
        description="llm judges: OpenAI-compatible server root (.../v1), or a list of servers of one model "
        "(requests spread over them; a failed server's are sent to the others).",
    )
    api_key_env: str | None = Field(None, description="Name of the env var holding the API key.")
    rubric: str | None = Field(
        None,
        description="llm: prompt template with {response} (required), {prompt}, {low}, {high}; pairwise_llm: "
        "with {response_a}, {response_b} (required), {prompt}. Only these placeholders are filled in; other "
        "braces (e.g. JSON) are kept as written. Default templates are used if unset.",
    )
    score_range: tuple[float, float] = Field(
        (1.0, 10.0), description="llm: the score scale the rubric asks for; out-of-range = abstain."
    )
    use_logprobs: bool = Field(
        True,
        description="pairwise_llm: read P(A) from the verdict tokens' logprobs when the server "
        "returns them, else parse the verdict from text.",
    )
    batch_size: int = Field(
        8, ge=1, le=4096, description="reward_model / pairrm / gpm: candidates (pairrm: pairs) per forward."
    )
    in_flight: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="llm judges: requests in flight for the whole judge stage (one window, shared by the two "
        "shards judged side by side). None: per server, 256 for a vLLM server (its /v1/models says so), else 32.",
    )
    max_length: int = Field(1024, ge=8, le=131072, description="reward_model / pairrm / gpm: tokens per input.")
    dtype: RewardModelDtype = Field(
        "auto", description="reward_model / gpm: weights' dtype; auto = the checkpoint's (its config's dtype)."
    )
    tau: float = Field(
        0.1,
        gt=0.0,
        le=100.0,
        description="gpm: the temperature the checkpoint was trained with, P = sigmoid(score / tau); not stored "
        "in the checkpoint: 0.1 is the authors' (their general_preference_tau).",
    )
    device_map: int | str | dict[str, int | str] | None = Field(
        None,
        description="reward_model: transformers' device_map: auto | balanced | balanced_low_0 | sequential, "
        "one device (cpu, cuda:1, 0), or {module name: device}. None: cuda if available, else cpu.",
    )
    trust_remote_code: bool = Field(
        False,
        description="reward_model: run the model folder's own Python code (auto_map), as custom "
        "(e.g. multi-objective) reward models need. Off unless opted in: that code runs unreviewed.",
    )
    score_output: str = Field(
        "logits",
        min_length=1,
        description="reward_model: the model output's field that holds the scores: logits (sequence "
        "classifiers), or what a custom model returns (e.g. score, rewards).",
    )
    score_index: int = Field(
        0,
        ge=0,
        le=4096,
        description="reward_model: column of score_output, (batch, n) -> (batch,), e.g. one objective.",
    )
    prefix_sharing: bool = Field(
        True,
        description="reward_model: run the tokens a prompt's candidates share once, not once per candidate (their "
        "keys and values reused; causal decoders read with a chat template; scores equal up to float rounding). "
        "False: every candidate's whole text.",
    )
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
    request_timeout: float = Field(
        120.0, gt=0.0, le=3600.0, description="llm judges: seconds per try, connect to last byte."
    )
    timeout: float | None = Field(
        None,
        gt=0.0,
        le=86400.0,
        description="python judges (`function` or `reward_funcs`): seconds per call (the function runs in a "
        "worker process, stopped when time is up; the stage stops naming the judge and row); llm judges: seconds "
        "per try, in place of request_timeout. None: no limit (python) / request_timeout (llm).",
    )
    stage_timeout: float | None = Field(
        None,
        gt=0.0,
        le=7 * 86400.0,
        description="python judges: seconds for all of one judge stage's calls (with `reward_funcs`, each "
        "function's); None: no limit.",
    )
    max_retries: int = Field(4, ge=0, le=20, description="llm judges: retries per request.")
    max_new_tokens: int = Field(16, ge=1, le=4096, description="llm judges: verdict length.")

    @field_validator("type")
    @classmethod
    def _known_type(cls, name: str) -> str:
        judge_spec(name)  # an unknown type: an error listing the registered ones
        return name

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, url: str | list[str] | None) -> str | list[str] | None:
        check_base_url(url, "judge")  # before the type's checks: an empty list is not "no server"
        return url

    @model_validator(mode="after")
    def _check(self) -> JudgeConfig:
        """The type's own rules, then the keys it reads and needs (`judge_kinds`), then how its
        verdicts become preferences."""
        spec = self.spec
        if spec.check is not None:
            spec.check(self)
        check_judge_keys(self, {k: f.default for k, f in JudgeConfig.model_fields.items()})
        if self.preferences is None:
            self.preferences = spec.preferences[0]
        elif self.preferences not in spec.preferences:
            raise ValueError(
                f"judge.preferences: {self.preferences} does not apply to judge.type: {self.type}; "
                f"it takes {' or '.join(spec.preferences)}."
            )
        # against the default, not fields_set: a dumped config (every field set) validates again
        if (
            self.preferences_temperature != JudgeConfig.model_fields["preferences_temperature"].default
            and self.preferences != "bradley_terry"
        ):
            raise ValueError(
                f"judge.preferences_temperature applies to preferences: bradley_terry only "
                f"(judge.type: {self.type} forms them by {self.preferences}); remove it."
            )
        check_key_env(self.api_key_env, "judge")
        return self

    @property
    def spec(self) -> JudgeSpec:
        """This judge type's entry in the registry."""
        return judge_spec(self.type)

    @property
    def is_pairwise(self) -> bool:
        return self.spec.pairwise


__all__ = ["JudgeConfig", "Preferences", "RewardModelDtype"]
