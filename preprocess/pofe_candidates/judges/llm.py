"""LLM judges over an OpenAI-compatible server (/v1/chat/completions).

- `ChatJudge`: the base both LLM judges share: one chat request per verdict, threads.
- `LLMRubricJudge` (scalar): asks for a score on `score_range`; the first number in the reply
  is the score; no number, or one out of range, is an abstention.
- The pairwise LLM judge is in pairwise.py.

The judge's own chat template is applied by the server (chat route). A request that fails
for good (EndpointError: server down, 4xx, retries exhausted) stops the run rather than
abstaining: the current shard is not written, so a restart continues from it once the server
is back. Replies that arrive but cannot be read are abstentions (counted).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

from pofe.errors import PofeError
from pofe_candidates.config import JudgeConfig, fill_rubric
from pofe_candidates.judges.interface import JudgeStats, Score
from pofe_candidates.openai_client import OpenAIClient
from pofe_candidates.render import Prompt, prompt_text
from pofe_candidates.replicas import client_for
from pofe_candidates.server_window import server_window

DEFAULT_RUBRIC = (
    "Rate how well the response answers the request, on a scale from {low:g} to {high:g} "
    "({high:g} is best). Reply with the number only.\n\n"
    "[Request]\n{prompt}\n\n[Response]\n{response}\n\nScore:"
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def parse_score(text: str, low: float, high: float) -> float | str:
    """First number in text if within [low, high]; else a reason string."""
    m = _NUMBER.search(text)
    if m is None:
        return f"unparseable: no number in {text[:40]!r}"
    v = float(m.group())
    if not low <= v <= high:
        return f"out of range: {v} not in [{low}, {high}]"
    return v


class UnreadableReply(PofeError):
    """The server answered, but not with a chat completion: an abstention, not a failure."""


class ChatJudge:
    """One chat request per verdict, greedy replies, `cfg.in_flight` requests in flight (by
    default what the servers run, `server_window`): one window for the judge's life, shared by
    every call."""

    # the judge stage judges two shards at once for such a judge (`pofe_candidates.shards.
    # judged_in_turn`): the next shard's requests fill the window while a shard's last ones run
    overlaps_shards = True

    def __init__(self, client: OpenAIClient, cfg: JudgeConfig):
        self.client = client
        self.cfg = cfg
        self.model = cfg.model or "default"
        self.stats = JudgeStats()
        self.window: int | None = None  # requests in flight, known at the first call (`map`)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> ChatJudge:
        """The judge on `judge.base_url`'s server(s) (several: requests spread over them, `replicas`)."""
        return cls(client_for(cfg), cfg)

    def chat(self, content: str, **extra) -> dict:
        """The first choice of a one-turn chat request; UnreadableReply if there is none."""
        payload = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.cfg.max_new_tokens,
            "temperature": 0.0,
            **extra,
        }
        body = self.client.post("chat/completions", payload)
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise UnreadableReply(f"bad response: no choices in {str(body)[:80]!r}")
        reply = (choices[0].get("message") or {}).get("content")
        # a reply far beyond max_tokens is a server ignoring it: an error naming the server, as for completions
        self.client.check_lengths("chat/completions", payload, [reply] if isinstance(reply, str) else [])
        return choices[0]

    def map(self, fn, items: list) -> list:
        """fn over items in the judge's request window, results in order. Calls from several
        threads queue into the one window, so it never holds more than its size."""
        with self._pool_lock:
            if self._pool is None:
                # as set, else what each server's /v1/models says it runs (replicas.py spreads them)
                self.window = self.cfg.in_flight or server_window(self.client, "judge.in_flight")
                self._pool = ThreadPoolExecutor(max_workers=self.window, thread_name_prefix="pofe-llm-judge")
        return list(self._pool.map(fn, items))


class LLMRubricJudge(ChatJudge):
    """Scalar: a score per (prompt, response) from a rubric prompt."""

    # the rubric quotes the dataset prompt's text (its last user turn), not a chat template
    reads_rendered_prompt = False
    reads_columns = False

    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        low, high = self.cfg.score_range
        template = self.cfg.rubric or DEFAULT_RUBRIC
        items = [
            (p, k, prompt, r)
            for p, (prompt, rs) in enumerate(zip(prompts, responses, strict=True))
            for k, r in enumerate(rs)
        ]

        def one(item) -> Score:
            p, k, prompt, response = item
            where = f"candidate {k} (llm judge at {self.client.base_url})"
            text = fill_rubric(
                template, {"prompt": prompt_text(prompt), "response": response, "low": low, "high": high}
            )
            try:
                choice = self.chat(text)
                content = (choice.get("message") or {}).get("content") or ""
            except UnreadableReply as e:
                return self.stats.abstain(str(e), allow=self.cfg.allow_abstain, where=where, prompt=p)
            v = parse_score(content, low, high)
            if isinstance(v, str):
                return self.stats.abstain(v, allow=self.cfg.allow_abstain, where=where, prompt=p)
            return v

        flat = self.map(one, items)
        self.stats.count_call(len(items))
        out, i = [], 0
        for rs in responses:
            out.append(flat[i : i + len(rs)])
            i += len(rs)
        return out


__all__ = ["ChatJudge", "LLMRubricJudge", "UnreadableReply", "parse_score"]
