"""`pofe.judge`: who scores the candidates, and how verdicts become SPPO preferences."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import StrictConfig
from .credentials import check_base_url, check_key_env

JudgeType = Literal["python", "python_pairwise", "reward_model", "llm", "pairwise_llm", "pairrm"]
Preferences = Literal["bradley_terry", "hard", "both_orders", "authors"]  # formulas: win_rates.py, pairrm.py

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


class JudgeConfig(StrictConfig):
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
        check_key_env(self.api_key_env, "judge")
        check_base_url(self.base_url, "judge")
        return self

    @property
    def is_pairwise(self) -> bool:
        return self.type in PAIRWISE_JUDGES
