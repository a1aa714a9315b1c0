"""Judges: who scores the candidates. One small interface each, one batched method.

Scalar judges give one reward per candidate (RRHF rewards; Bradley-Terry win rates for SPPO):

    judge.score(prompts, responses) -> list[list[float | Abstain]]        # P prompts x K_p

Pairwise judges give, per prompt, a (K, K) matrix P[i, j] = P(y_i beats y_j) whose pairs
were judged in both orders and combined with `symmetrize_preferences` (position bias):

    judge.preferences(prompts, responses) -> list[PairwiseVerdict]   # .matrix (K_p, K_p)

A judge that cannot give a verdict (an exception in a python judge, a non-finite score, an
unparseable LLM reply, a failed request) returns `Abstain(reason)`, never a sentinel number
such as -1 that could be trained on. Abstentions are counted in `judge.stats`; with
`allow_abstain: false` the first one stops the run and names the row.
"""

from __future__ import annotations

import importlib
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .config import JudgeConfig, read_api_key
from .render import Prompt


@dataclass(frozen=True)
class Abstain:
    """The typed failure value: no verdict for this candidate (or pair), and why."""

    reason: str


Score = float | Abstain


@dataclass
class JudgeStats:
    """Counts reported in summary.json (thread-safe)."""

    calls: int = 0
    abstentions: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_call(self, n: int = 1) -> None:
        with self._lock:
            self.calls += n

    def abstain(self, reason: str, *, allow: bool, where: str) -> Abstain:
        if not allow:
            raise JudgeError(f"judge gave no verdict for {where}: {reason} (set judge.allow_abstain: true to skip and count these)")
        with self._lock:
            self.abstentions += 1
            kind = reason.split(":")[0][:60]
            self.reasons[kind] = self.reasons.get(kind, 0) + 1
        return Abstain(reason)

    def as_dict(self) -> dict:
        return {"calls": self.calls, "abstentions": self.abstentions, "reasons": dict(self.reasons)}


class JudgeError(RuntimeError):
    """A verdict was missing and abstaining is not allowed."""


class ScalarJudge(Protocol):
    stats: JudgeStats

    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        """P prompts, P lists of K_p responses -> P lists of K_p scores (float or Abstain)."""
        ...


class PairwiseJudge(Protocol):
    stats: JudgeStats

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[Any]:
        """P prompts, P lists of K_p responses -> P `PairwiseVerdict`s (judge_pairwise.py):
        .matrix (K_p, K_p) float64 with P + P.T = 1 and diagonal 1/2, .abstained_pairs."""
        ...


def load_function(spec: str) -> Callable[..., Any]:
    """'package.module:function' -> the function, with an error that says what is missing."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"judge.function must look like 'module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"judge.function {spec!r}: cannot import module {module_name!r}: {e}") from e
    try:
        fn = getattr(module, attr)
    except AttributeError as e:
        raise AttributeError(f"judge.function {spec!r}: module {module_name!r} has no attribute {attr!r}") from e
    if not callable(fn):
        raise TypeError(f"judge.function {spec!r} is not callable")
    return fn


class PythonJudge:
    """`module:function(prompt, response) -> float`, called once per candidate.

    `prompt` is the dataset's prompt as stored (a string or chat messages). Exceptions and
    non-finite results become abstentions naming the exception.
    """

    def __init__(self, fn: Callable[[Prompt, str], float], *, allow_abstain: bool = True, name: str = "python"):
        self.fn = fn
        self.allow_abstain = allow_abstain
        self.name = name
        self.stats = JudgeStats()

    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        out: list[list[Score]] = []
        for p, (prompt, cands) in enumerate(zip(prompts, responses, strict=True)):
            row: list[Score] = []
            for k, resp in enumerate(cands):
                self.stats.count_call()
                where = f"prompt {p}, candidate {k} ({self.name})"
                try:
                    v = float(self.fn(prompt, resp))
                except Exception as e:  # a user function: any failure is an abstention, counted
                    row.append(self.stats.abstain(f"{type(e).__name__}: {e}", allow=self.allow_abstain, where=where))
                    continue
                if not math.isfinite(v):
                    row.append(self.stats.abstain(f"non-finite score: {v}", allow=self.allow_abstain, where=where))
                    continue
                row.append(v)
            out.append(row)
        return out


def make_judge(cfg: JudgeConfig) -> ScalarJudge | PairwiseJudge:
    """Build the configured judge (heavy imports only for the chosen type)."""
    if cfg.type == "python":
        return PythonJudge(load_function(cfg.function), allow_abstain=cfg.allow_abstain, name=cfg.function)
    if cfg.type == "reward_model":
        from .judge_reward_model import RewardModelJudge

        return RewardModelJudge(
            cfg.model, batch_size=cfg.batch_size, max_length=cfg.max_length, allow_abstain=cfg.allow_abstain
        )
    if cfg.type in ("llm", "pairwise_llm"):
        from .judge_llm import LLMRubricJudge, PairwiseLLMJudge
        from .openai_client import OpenAIClient

        client = OpenAIClient(
            cfg.base_url, api_key=read_api_key(cfg.api_key_env), timeout=cfg.request_timeout, max_retries=cfg.max_retries
        )
        cls = LLMRubricJudge if cfg.type == "llm" else PairwiseLLMJudge
        return cls(client, cfg)
    if cfg.type == "pairrm":
        from .pairrm import PairRMJudge

        return PairRMJudge.from_pretrained(cfg.model, batch_size=cfg.batch_size)  # lengths: ranker_config.json
    raise ValueError(f"unknown judge.type {cfg.type!r}")


def is_pairwise(judge: object) -> bool:
    return hasattr(judge, "preferences")
