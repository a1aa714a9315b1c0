"""LLM judges over an OpenAI-compatible server (/v1/chat/completions).

- `LLMRubricJudge` (scalar): asks for a score on `score_range`; the first number in the reply
  is the score; no number, or one out of range, is an abstention.
- `PairwiseLLMJudge`: asks which of two responses is better ("A" or "B"), each unordered pair
  in both orders (judge_pairwise.py). P(A) comes from the verdict token's logprobs when the
  server returns them (`top_logprobs`), else from the reply's text (1 or 0).

The judge's own chat template is applied by the server (chat route). A request that fails
for good (EndpointError: server down, 4xx, retries exhausted) stops the run rather than
abstaining: the current shard is not written, so a restart continues from it once the server
is back. Replies that arrive but cannot be read are abstentions (counted).
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor

from .config import JudgeConfig
from .judge_pairwise import PairwiseVerdict, preferences_both_orders
from .judges import Abstain, JudgeStats, Score
from .openai_client import OpenAIClient
from .render import Prompt, prompt_text

DEFAULT_RUBRIC = (
    "Rate how well the response answers the request, on a scale from {low:g} to {high:g} "
    "({high:g} is best). Reply with the number only.\n\n"
    "[Request]\n{prompt}\n\n[Response]\n{response}\n\nScore:"
)
DEFAULT_PAIRWISE = (
    "Which response answers the request better? Reply with one letter: A or B.\n\n"
    "[Request]\n{prompt}\n\n[Response A]\n{response_a}\n\n[Response B]\n{response_b}\n\nBetter response:"
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_VERDICT = re.compile(r"(?<![A-Za-z])([AB])(?![A-Za-z])")


def parse_score(text: str, low: float, high: float) -> float | str:
    """First number in text if within [low, high]; else a reason string."""
    m = _NUMBER.search(text)
    if m is None:
        return f"unparseable: no number in {text[:40]!r}"
    v = float(m.group())
    if not low <= v <= high:
        return f"out of range: {v} not in [{low}, {high}]"
    return v


def parse_verdict(text: str) -> float | str:
    """1.0 if the first standalone letter A/B is A, 0.0 if B; else a reason string."""
    m = _VERDICT.search(text)
    if m is None:
        return f"unparseable: no A/B verdict in {text[:40]!r}"
    return 1.0 if m.group(1) == "A" else 0.0


def verdict_from_logprobs(top: list[dict]) -> float | None:
    """P(A) from the first generated token's top_logprobs, renormalised over {A, B}.

    Tokens are matched after stripping spaces and brackets (" A", "[[A"). If only one of A/B is
    listed, the other gets the lowest listed probability (an upper bound on it, which pulls the
    estimate towards 1/2). None if neither is listed.
    """
    pa = pb = 0.0
    for t in top:
        tok = str(t.get("token", "")).strip().strip("[]()*").strip()
        p = math.exp(float(t.get("logprob", -math.inf)))
        if tok == "A":
            pa += p
        elif tok == "B":
            pb += p
    if pa == 0.0 and pb == 0.0:
        return None
    floor = min((math.exp(float(t.get("logprob", -math.inf))) for t in top), default=0.0)
    pa, pb = pa or floor, pb or floor
    return pa / (pa + pb)


class _ChatJudge:
    def __init__(self, client: OpenAIClient, cfg: JudgeConfig):
        self.client = client
        self.cfg = cfg
        self.model = cfg.model or "default"
        self.stats = JudgeStats()

    def _chat(self, content: str, **extra) -> dict:
        body = self.client.post(
            "chat/completions",
            {
                "model": self.model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": self.cfg.max_new_tokens,
                "temperature": 0.0,
                **extra,
            },
        )
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise _Unreadable(f"bad response: no choices in {str(body)[:80]!r}")
        return choices[0]

    def _map(self, fn, items: list) -> list:
        with ThreadPoolExecutor(max_workers=max(1, min(self.cfg.batch_size, len(items)))) as pool:
            return list(pool.map(fn, items))


class _Unreadable(Exception):
    pass


class LLMRubricJudge(_ChatJudge):
    """Scalar: a score per (prompt, response) from a rubric prompt."""

    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        low, high = self.cfg.score_range
        template = self.cfg.rubric or DEFAULT_RUBRIC
        items = [(p, k, prompt, r) for p, (prompt, rs) in enumerate(zip(prompts, responses, strict=True)) for k, r in enumerate(rs)]

        def one(item) -> Score:
            p, k, prompt, response = item
            where = f"prompt {p}, candidate {k} (llm judge at {self.client.base_url})"
            text = template.format(prompt=prompt_text(prompt), response=response, low=low, high=high)
            try:
                choice = self._chat(text)
                content = (choice.get("message") or {}).get("content") or ""
            except _Unreadable as e:
                return self.stats.abstain(str(e), allow=self.cfg.allow_abstain, where=where)
            v = parse_score(content, low, high)
            if isinstance(v, str):
                return self.stats.abstain(v, allow=self.cfg.allow_abstain, where=where)
            return v

        flat = self._map(one, items)
        self.stats.count_call(len(items))
        out, i = [], 0
        for rs in responses:
            out.append(flat[i : i + len(rs)])
            i += len(rs)
        return out


class PairwiseLLMJudge(_ChatJudge):
    """Pairwise: P(A beats B) per ordered pair; both orders combined per prompt."""

    TOP_LOGPROBS = 20  # vLLM's default cap on top_logprobs

    def judge_pairs(self, items: list[tuple[Prompt, str, str]]) -> list[float | Abstain]:
        template = self.cfg.rubric or DEFAULT_PAIRWISE
        extra = {"logprobs": True, "top_logprobs": self.TOP_LOGPROBS} if self.cfg.use_logprobs else {}

        def one(arg) -> float | Abstain:
            n, (prompt, a, b) = arg
            where = f"pair {n} (pairwise llm judge at {self.client.base_url})"
            text = template.format(prompt=prompt_text(prompt), response_a=a, response_b=b)
            try:
                choice = self._chat(text, **extra)
            except _Unreadable as e:
                return self.stats.abstain(str(e), allow=self.cfg.allow_abstain, where=where)
            if self.cfg.use_logprobs:
                content = ((choice.get("logprobs") or {}).get("content")) or []
                if content and isinstance(content[0], dict):
                    p = verdict_from_logprobs(content[0].get("top_logprobs") or [])
                    if p is not None:
                        return p
            v = parse_verdict((choice.get("message") or {}).get("content") or "")
            if isinstance(v, str):
                return self.stats.abstain(v, allow=self.cfg.allow_abstain, where=where)
            return v

        return self._map(one, list(enumerate(items)))

    def preferences(self, prompts: list[Prompt], responses: list[list[str]]) -> list[PairwiseVerdict]:
        return preferences_both_orders(self.judge_pairs, prompts, responses, self.stats)


__all__ = ["LLMRubricJudge", "PairwiseLLMJudge", "parse_score", "parse_verdict", "verdict_from_logprobs"]
