"""`pofe.judge`: who scores the candidates, and how verdicts become SPPO preferences."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pofe_candidates.config.base import StrictConfig
from pofe_candidates.config.credentials import check_base_url, check_key_env

JudgeType = Literal["python", "python_pairwise", "reward_model", "llm", "pairwise_llm", "pairrm"]
Preferences = Literal["bradley_terry", "hard", "both_orders", "authors"]  # formulas: win_rates.py, judges/pairrm.py

SCALAR_JUDGES = ("python", "reward_model", "llm")
PAIRWISE_JUDGES = ("python_pairwise", "pairwise_llm", "pairrm")
FUNCTION_JUDGES = ("python", "python_pairwise")  # call user functions (imported before generating)
RewardModelDtype = Literal["auto", "float32", "bfloat16", "float16"]
# device_map: accelerate's placement strategies, or one device (torch's spelling)
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_DEVICE = re.compile(r"(cpu|mps|disk|(cuda|xpu|npu|hpu)(:\d+)?|\d+)")
# reward_model-only keys and their defaults: set for another judge, an error (they would be ignored)
REWARD_MODEL_KEYS = ("dtype", "device_map", "trust_remote_code", "score_output", "score_index", "prefix_sharing")
# `judge.preferences` each judge accepts, its default first. "authors" (the SPPO scripts') needs
# PairRM's logits; the other pairwise judges give probabilities, which "both_orders" combines.
JUDGE_PREFERENCES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(SCALAR_JUDGES, ("bradley_terry", "hard")),
    **dict.fromkeys(("python_pairwise", "pairwise_llm"), ("both_orders",)),
    "pairrm": ("authors", "both_orders"),
}


# The placeholders each LLM judge's rubric may use, and those it must use. Only these are filled
# in (low and high take a format spec, e.g. {low:g}); any other brace is literal text, so a
# rubric can show JSON such as {"score": 7} as it is.
RUBRIC_FIELDS: dict[str, tuple[str, ...]] = {
    "llm": ("prompt", "response", "low", "high"),
    "pairwise_llm": ("prompt", "response_a", "response_b"),
}
RUBRIC_REQUIRED: dict[str, tuple[str, ...]] = {"llm": ("response",), "pairwise_llm": ("response_a", "response_b")}
_NUMERIC_FIELDS = ("low", "high")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)(?::([^{}]*))?\}")


def fill_rubric(template: str, values: dict[str, object]) -> str:
    """`template` with each known placeholder `{name}` / `{name:spec}` (a key of `values`)
    replaced by its value, in one pass (a response quoting "{prompt}" is not filled again);
    everything else, other braces included, is kept as written."""

    def one(m: re.Match) -> str:
        name, spec = m.group(1), m.group(2)
        return m.group(0) if name not in values else format(values[name], spec or "")

    return _PLACEHOLDER.sub(one, template)


def check_rubric(template: str, judge_type: str) -> None:
    """Raise ValueError if the rubric lacks a required placeholder or gives a text field a
    format spec (or a number field a spec that does not format a number)."""
    known, required = RUBRIC_FIELDS[judge_type], RUBRIC_REQUIRED[judge_type]
    used = {m.group(1): m.group(2) for m in _PLACEHOLDER.finditer(template) if m.group(1) in known}
    missing = [f"{{{f}}}" for f in required if f not in used]
    if missing:
        raise ValueError(
            f"judge.rubric has no {' or '.join(missing)}: the judge would never see the candidate. Placeholders "
            f"filled in for judge.type: {judge_type}: {', '.join(f'{{{f}}}' for f in known)}; any other brace "
            '(e.g. JSON such as {"score": 7}) is kept as written.'
        )
    for m in _PLACEHOLDER.finditer(template):
        name, spec = m.group(1), m.group(2)
        if name not in known or spec is None:
            continue
        try:
            format(1.0 if name in _NUMERIC_FIELDS else "text", spec)
        except ValueError as e:
            raise ValueError(
                f"judge.rubric: {m.group(0)} has a format spec that does not apply ({e}); write {{{name}}}."
            ) from None


class JudgeConfig(StrictConfig):
    """Who scores the candidates.

    Scalar judges (python, reward_model, llm) give one reward per candidate: RRHF uses them
    directly; SPPO turns them into win rates by `preferences` (bradley_terry or hard; transitive
    by construction). Pairwise judges (python_pairwise, pairwise_llm, pairrm) give a K x K
    preference matrix: SPPO only (RRHF needs a scalar reward per candidate).
    """

    type: JudgeType = Field(
        "python", description="python | python_pairwise | reward_model | llm | pairwise_llm | pairrm."
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
        "both_orders; python_pairwise, pairwise_llm: both_orders. None: the judge's default.",
    )
    preferences_temperature: float = Field(1.0, gt=0.0, le=1e6, description="bradley_terry: the reward scale T.")
    model: str | None = Field(
        None, description="reward_model / pairrm: local path or hub id; llm judges: served model name."
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
    batch_size: int = Field(8, ge=1, le=4096, description="reward_model / pairrm: candidates (or pairs) per forward.")
    in_flight: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="llm judges: requests in flight for the whole judge stage (one window, shared by the two "
        "shards judged side by side). None: per server, 256 for a vLLM server (its /v1/models says so), else 32.",
    )
    max_length: int = Field(1024, ge=8, le=131072, description="reward_model/pairrm: tokens per input.")
    dtype: RewardModelDtype = Field(
        "auto", description="reward_model: weights' dtype; auto = the checkpoint's (its config's dtype)."
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

    def _check_window(self) -> None:
        """An LLM judge's window is `in_flight`: `batch_size` set for one would be ignored."""
        llm = self.type in ("llm", "pairwise_llm")
        if self.in_flight is not None and not llm:
            raise ValueError(f"judge.in_flight applies to llm judges, not to judge.type: {self.type}; remove it.")
        # against the default, not fields_set: a dumped config (every field set) validates again
        if llm and self.batch_size != JudgeConfig.model_fields["batch_size"].default:
            servers = len(self.base_url) if isinstance(self.base_url, list) else 1
            raise ValueError(
                f"judge.batch_size applies to reward_model and pairrm judges: judge.type: {self.type} keeps "
                f"judge.in_flight requests in flight (default: 256 per vLLM server, 32 per other server); set "
                f"judge.in_flight: {self.batch_size * servers} instead "
                "(batch_size per server was the window before)."
            )

    def _check_timeouts(self) -> None:
        """judge.timeout / stage_timeout only where they bound something (timed.py, openai_client.py)."""
        python = self.type in ("python", "python_pairwise")
        for key, applies in (("timeout", python or self.type in ("llm", "pairwise_llm")), ("stage_timeout", python)):
            if getattr(self, key) is not None and not applies:
                raise ValueError(
                    f"judge.{key} applies to python judges (judge.function or judge.reward_funcs)"
                    f"{' and llm judges' if key == 'timeout' else ''}, not to judge.type: {self.type}; "
                    "remove it."
                )

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, url: str | list[str] | None) -> str | list[str] | None:
        check_base_url(url, "judge")  # before the type's checks: an empty list is not "no server"
        return url

    @model_validator(mode="after")
    def _check(self) -> JudgeConfig:
        self._check_functions()
        self._check_reward_model_keys()
        self._check_timeouts()
        self._check_window()
        allowed = JUDGE_PREFERENCES[self.type]
        if self.preferences is None:
            self.preferences = allowed[0]
        elif self.preferences not in allowed:
            raise ValueError(
                f"judge.preferences: {self.preferences} does not apply to judge.type: {self.type}; "
                f"it takes {' or '.join(allowed)}."
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
        if self.type in ("reward_model", "pairrm") and not self.model:
            raise ValueError(f"judge.type={self.type} needs judge.model (a local path or hub id).")
        if self.type in ("llm", "pairwise_llm") and not self.base_url:
            raise ValueError(
                f"judge.type={self.type} needs judge.base_url (an OpenAI-compatible server, "
                "e.g. http://127.0.0.1:8000/v1)."
            )
        if self.rubric is not None and self.type in RUBRIC_FIELDS:
            check_rubric(self.rubric, self.type)
        lo, hi = self.score_range
        if not lo < hi:
            raise ValueError(f"judge.score_range must be (low, high) with low < high, got {self.score_range}.")
        check_key_env(self.api_key_env, "judge")
        return self

    def _check_functions(self) -> None:
        if self.reward_funcs is not None and self.type != "python":
            raise ValueError(f"judge.reward_funcs applies to judge.type: python, not {self.type}; remove it.")
        if self.type == "python" and self.reward_funcs is not None:
            if self.function:
                raise ValueError(
                    "judge.function and judge.reward_funcs are both set: a python judge calls one "
                    "per-candidate function or a list of batched reward functions; keep one."
                )
            bad = [f for f in self.reward_funcs if "." not in f.strip(".") or ":" in f]
            if bad:
                raise ValueError(
                    f"judge.reward_funcs: {bad} are not dotted paths 'package.module.function' "
                    "(as axolotl's trl.reward_funcs)."
                )
        elif self.type in FUNCTION_JUDGES and (not self.function or ":" not in self.function):
            hint = " or judge.reward_funcs: [package.module.function, ...]" if self.type == "python" else ""
            raise ValueError(
                f"judge.type={self.type} needs judge.function: 'module:function' (e.g. pofe.demo.task:reward){hint}."
            )
        if self.reward_weights is not None:
            if self.reward_funcs is None:
                raise ValueError("judge.reward_weights weighs judge.reward_funcs, which is not set; remove it.")
            if len(self.reward_weights) != len(self.reward_funcs):
                raise ValueError(
                    f"judge.reward_weights has {len(self.reward_weights)} weights for "
                    f"{len(self.reward_funcs)} reward_funcs; give one weight per function."
                )
            if not all(math.isfinite(w) for w in self.reward_weights):
                raise ValueError(f"judge.reward_weights must be finite numbers, got {self.reward_weights}.")

    def _check_reward_model_keys(self) -> None:
        if self.type != "reward_model":
            # against the defaults, not fields_set: a dumped config (every field set) validates again
            changed = [k for k in REWARD_MODEL_KEYS if getattr(self, k) != JudgeConfig.model_fields[k].default]
            if changed:
                raise ValueError(
                    f"judge.{', judge.'.join(changed)} apply to judge.type: reward_model only "
                    f"(this judge is {self.type}); remove them."
                )
        dm = self.device_map
        if isinstance(dm, int) and dm < 0:
            raise ValueError(f"judge.device_map: a GPU index is >= 0, got {dm}.")
        if isinstance(dm, str) and dm not in DEVICE_MAP_STRATEGIES and not _DEVICE.fullmatch(dm):
            raise ValueError(
                f"judge.device_map: {dm!r} is neither {' | '.join(DEVICE_MAP_STRATEGIES)} nor a "
                "device (cpu, cuda, cuda:N, N, mps)."
            )
        if isinstance(dm, dict):
            bad = {m: d for m, d in dm.items() if not (isinstance(d, int) and d >= 0 or _DEVICE.fullmatch(str(d)))}
            if not dm or bad:
                raise ValueError(
                    f"judge.device_map: a map of module name -> device (cpu, cuda:N, N, disk), e.g. "
                    f"{{'': 'cuda:0'}}; {f'not devices: {bad}' if bad else 'got an empty map'}."
                )

    @property
    def is_pairwise(self) -> bool:
        return self.type in PAIRWISE_JUDGES
