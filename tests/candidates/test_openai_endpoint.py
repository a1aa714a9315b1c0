"""The OpenAI-compatible backend and LLM judges against a real local HTTP server (127.0.0.1)
that refuses, is slow, returns garbage or 500s: the errors name the URL and cause; counts add up."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pofe_candidates.config import GenerateConfig, JudgeConfig
from pofe_candidates.generators import make_generator
from pofe_candidates.generators.openai import OpenAIGenerator
from pofe_candidates.judges import Abstain
from pofe_candidates.judges.llm import LLMRubricJudge
from pofe_candidates.judges.pairwise import PairwiseLLMJudge
from pofe_candidates.openai_client import EndpointError, retry_after_seconds
from pofe_candidates.render import Rendered
from pofe_candidates.win_rates import win_rates
from tests.openai_server import FakeServer, chat_reply, completions_ok, openai_client


def _rendered(*texts):
    """Rendered prompts whose ids are (index, length of text): what POFE sends by default."""
    return [Rendered(t, 2, ids=[i, len(t)]) for i, t in enumerate(texts)]


def _sampling(n=3, seed=10):
    return GenerateConfig(backend="openai", base_url="http://127.0.0.1:1/v1", num_candidates=n, seed=seed).sampling()


def test_generate_ok_order_and_seeds():
    with FakeServer(completions_ok) as srv:
        gen = OpenAIGenerator(openai_client(srv.url), "m")
        out = gen.generate(_rendered("p0", "p1"), 3, _sampling())
    assert out == [["cand 10-0", "cand 10-1", "cand 10-2"], ["cand 11-0", "cand 11-1", "cand 11-2"]]
    assert sorted(b["prompt"] for _, b in srv.requests) == [[0, 2], [1, 2]]  # the token ids, not the text
    assert all(p == "/v1/completions" and b["n"] == 3 for p, b in srv.requests)


def test_connection_refused_names_url_after_bounded_retries():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = GenerateConfig(backend="openai", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, num_candidates=2)
    gen = make_generator(cfg, "policy")
    gen.client.backoff = 0.01
    t = time.monotonic()
    with pytest.raises(
        EndpointError, match=rf"POST http://127.0.0.1:{port}/v1/completions failed after 3 tries: connection refused"
    ):
        gen.generate(_rendered("p"), 2, cfg.sampling())
    assert time.monotonic() - t < 10
    assert gen.client.stats.as_dict()["requests"] == 3 and gen.client.stats.retries == 2


def test_slow_server_times_out():
    with FakeServer(lambda p, b, a: (200, "{}", 1.5)) as srv:
        c = openai_client(srv.url, timeout=0.2, max_retries=1)
        t = time.monotonic()
        with pytest.raises(EndpointError, match="timeout: no answer within 0.2s"):
            c.completions({"prompt": "p", "n": 1})
        assert time.monotonic() - t < 1.5  # bounded by tries * timeout + back-off, not by the server
    assert c.stats.requests == 2


def test_garbage_is_retried_then_reported():
    with FakeServer(lambda p, b, a: (200, "<html>not json</html>", 0.0)) as srv:
        c = openai_client(srv.url, max_retries=2)
        with pytest.raises(EndpointError, match="invalid JSON"):
            c.completions({"n": 1})
    assert c.stats.requests == 3 and c.stats.failures == 1


def test_wrong_number_of_choices_is_an_error():
    with FakeServer(lambda p, b, a: (200, json.dumps({"choices": [{"index": 0, "text": "x"}]}), 0.0)) as srv:
        with pytest.raises(EndpointError, match="asked for n=3 completions, got 1"):
            OpenAIGenerator(openai_client(srv.url), "m").generate(_rendered("p"), 3, _sampling())


def test_500_then_recovers_with_counts():
    def flaky(path, body, attempt):
        return (500, "overloaded", 0.0) if attempt <= 2 else completions_ok(path, body, attempt)

    with FakeServer(flaky) as srv:
        gen = OpenAIGenerator(openai_client(srv.url, max_retries=3), "m", concurrency=1)
        out = gen.generate(_rendered("p"), 2, _sampling(n=2))
    assert out == [["cand 10-0", "cand 10-1"]]
    assert gen.client.stats.as_dict() == {"requests": 3, "retries": 2, "failures": 0, "causes": {}}


def test_500_forever_and_400_not_retried():
    with FakeServer(lambda p, b, a: (500, "boom", 0.0)) as srv:
        c = openai_client(srv.url, max_retries=2)
        with pytest.raises(EndpointError, match="HTTP 500: boom"):
            c.completions({})
    assert c.stats.requests == 3
    with FakeServer(lambda p, b, a: (400, '{"error": "bad model"}', 0.0)) as srv:
        c = openai_client(srv.url, max_retries=5)
        with pytest.raises(EndpointError, match="failed after 1 try: HTTP 400"):
            c.completions({})
    assert c.stats.requests == 1


def test_api_key_sent_in_header_never_in_errors(monkeypatch):
    monkeypatch.setenv("POFE_TEST_KEY", "secret-123")
    with FakeServer(lambda p, b, a: (500, "no", 0.0)) as srv:
        cfg = GenerateConfig(backend="openai", base_url=srv.url, api_key_env="POFE_TEST_KEY", max_retries=0)
        gen = make_generator(cfg, "policy")
        with pytest.raises(EndpointError) as e:
            gen.generate(_rendered("p"), 2, cfg.sampling())
    assert srv.request_headers[0]["Authorization"] == "Bearer secret-123"  # as sent on the wire
    assert "secret-123" not in str(e.value) and "secret-123" not in json.dumps(cfg.public_dict())


# ---- retry policy, deadline and error texts ------------------------------------------------


class Waits:
    """Records the client's waits instead of sleeping them (the tests read them, never time them)."""

    def __init__(self):
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class FixedRandom:
    """An rng whose random() returns the given values in turn."""

    def __init__(self, *values: float):
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def test_retry_after_seconds_and_http_date():
    now = datetime(2015, 10, 21, 7, 27, 30, tzinfo=UTC)
    assert retry_after_seconds("3", now) == 3.0
    assert retry_after_seconds(" 120 ", now) == 120.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now) == 30.0  # 07:28:00 - 07:27:30
    assert retry_after_seconds("Wed, 21 Oct 2015 07:00:00 GMT", now) == 0.0  # already past
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds("-5", now) is None
    assert retry_after_seconds(None, now) is None


def test_429_waits_as_long_as_retry_after_says_within_the_cap():
    """Retry-After 3 -> waits 3 s (not the 0.01 s back-off); Retry-After 600 -> the 60 s cap;
    an HTTP-date in the past -> no wait."""
    retry_after = {1: "3", 2: "600", 3: "Wed, 21 Oct 2015 07:28:00 GMT"}

    def limited(path, body, attempt):
        if attempt in retry_after:
            return 429, "slow down", 0.0, {"Retry-After": retry_after[attempt]}
        return completions_ok(path, body, attempt)

    waits = Waits()
    with FakeServer(limited) as srv:
        c = openai_client(srv.url, max_retries=3, sleep=waits)
        assert len(c.completions({"n": 1, "seed": 0})) == 1
    assert waits.delays == [3.0, 60.0, 0.0]
    assert c.stats.as_dict() == {"requests": 4, "retries": 3, "failures": 0, "causes": {}}


def test_backoff_is_exponential_capped_and_jittered():
    """backoff 0.01, cap 0.03: bases 0.01, 0.02, 0.03 (0.04 capped), 0.03 (0.08 capped);
    jitter factor 0.5 + 0.5 * r for r = 0, 1, 0.5, 0.5 -> 0.5, 1, 0.75, 0.75;
    waits 0.005, 0.02, 0.0225, 0.0225."""
    waits = Waits()
    with FakeServer(lambda p, b, a: (503, "busy", 0.0)) as srv:
        c = openai_client(srv.url, max_retries=4, max_backoff=0.03, sleep=waits, rng=FixedRandom(0.0, 1.0, 0.5, 0.5))
        with pytest.raises(EndpointError, match="failed after 5 tries: HTTP 503: busy. Server error"):
            c.completions({})
    assert waits.delays == pytest.approx([0.005, 0.02, 0.0225, 0.0225])


class TrickleServer:
    """Answers every request with a valid, space-padded JSON body, one byte every `gap_s`."""

    def __init__(self, gap_s: float, size: int):
        body = json.dumps({"choices": []}).encode().ljust(size)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(gap_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: the point of the test

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_request_timeout_bounds_the_whole_request_not_each_read():
    """Each byte comes within 0.4 s, so no single read ever times out; the 30-byte body takes
    12 s, far past request_timeout=1: the try must end as a timeout, not as a success."""
    with TrickleServer(gap_s=0.4, size=30) as srv:
        c = openai_client(srv.url, timeout=1.0, max_retries=0)
        with pytest.raises(EndpointError, match=r"failed after 1 try: timeout: no answer within 1.0s"):
            c.completions({"n": 1})
    assert c.stats.as_dict() == {"requests": 1, "retries": 0, "failures": 1, "causes": {"timeout": 1}}


@pytest.mark.parametrize(
    "status, key_env, says",
    [
        (401, None, r"refused the API key, which is missing or wrong \(none was sent: .* set api_key_env"),
        (
            403,
            "POFE_TEST_KEY",
            r"refused the API key, which is missing or wrong \(it was read from the environment variable POFE_TEST_KEY",
        ),
        (404, None, r"Not found: check base_url .* serves the model 'm'"),
        (429, None, r"Rate limited: lower in_flight"),
        (502, None, r"Server error: see the server's log"),
        (422, None, r"The server rejected the request: check the model name"),
    ],
)
def test_http_errors_say_what_the_status_means(status, key_env, says, monkeypatch):
    monkeypatch.setenv("POFE_TEST_KEY", "secret-123")
    with FakeServer(lambda p, b, a: (status, '{"error": "no"}', 0.0)) as srv:
        c = openai_client(srv.url, key_env=key_env, api_key="secret-123" if key_env else None, max_retries=0)
        with pytest.raises(EndpointError, match=says) as e:
            c.completions({"model": "m"})
    assert f"HTTP {status}" in str(e.value)
    assert "server is running" not in str(e.value) and "secret-123" not in str(e.value)


# ---- LLM judges against the fake server --------------------------------------------------


def test_llm_rubric_judge_scores_and_abstains():
    replies = {"good": "Score: 8", "meh": "I'd say 3.5", "chatty": "It is great!", "huge": "99"}

    def srv_fn(path, body, attempt):
        text = body["messages"][0]["content"]
        key = next(k for k in replies if f"[Response]\n{k}\n" in text)
        return 200, chat_reply(replies[key]), 0.0

    with FakeServer(srv_fn) as srv:
        cfg = JudgeConfig(type="llm", base_url=srv.url, score_range=(1, 10))
        j = LLMRubricJudge(openai_client(srv.url), cfg)
        out = j.score(["q"], [["good", "meh", "chatty", "huge"]])
    assert out[0][:2] == [8.0, 3.5]
    assert isinstance(out[0][2], Abstain) and "unparseable" in out[0][2].reason
    assert isinstance(out[0][3], Abstain) and "out of range" in out[0][3].reason
    assert j.stats.abstentions == 2 and j.stats.calls == 4
    assert all(p == "/v1/chat/completions" for p, _ in srv.requests)


def test_rubrics_with_literal_braces_are_sent_as_written():
    """Bad case 7 of issue 20: a rubric showing JSON ({"score": 7}) failed with a bare
    KeyError after generation. Only the known placeholders are filled, in one pass: braces in
    the rubric and in a response ("{prompt}") are kept as written."""
    rubric = 'Reply as JSON, e.g. {"score": 7}, from {low:g} to {high:g}.\n[Q] {prompt}\n[R] {response}'
    pairwise = '{"winner": "A"} or {"winner": "B"}?\n{prompt}\nA: {response_a}\nB: {response_b}'
    with FakeServer(lambda path, body, attempt: (200, chat_reply("7"), 0.0)) as srv:
        judge = LLMRubricJudge(openai_client(srv.url), JudgeConfig(type="llm", base_url=srv.url, rubric=rubric))
        assert judge.score(["q?"], [["see {prompt}"]]) == [[7.0]]
        pair = PairwiseLLMJudge(
            openai_client(srv.url),
            JudgeConfig(type="pairwise_llm", base_url=srv.url, rubric=pairwise, use_logprobs=False),
        )
        pair.judge_pairs([("q?", "x", "y")])
    sent = [b["messages"][0]["content"] for _, b in srv.requests]
    assert sent[0] == 'Reply as JSON, e.g. {"score": 7}, from 1 to 10.\n[Q] q?\n[R] see {prompt}'
    assert sent[1] == '{"winner": "A"} or {"winner": "B"}?\nq?\nA: x\nB: y'


@pytest.mark.parametrize(
    "judge_type, rubric, needle",
    [
        ("llm", "Rate {prompt} from 1 to 10.", r"judge.rubric has no \{response\}"),
        ("llm", "Rate {respnse}.", r"no \{response\}.*\{prompt\}, \{response\}, \{low\}, \{high\}"),
        ("pairwise_llm", "A: {response_a} or {response}?", r"no \{response_b\}"),
        ("llm", "{response} from {low:q}", r"\{low:q\} has a format spec that does not apply"),
    ],
)
def test_rubric_without_the_candidate_is_refused_at_config_time(judge_type, rubric, needle):
    with pytest.raises(ValueError, match=needle):
        JudgeConfig(type=judge_type, base_url="http://127.0.0.1:1/v1", rubric=rubric)


def test_pairwise_llm_judge_logprobs_both_orders_remove_position_bias():
    """True P(longer wins) = 0.8; the judge adds +0.1 to whichever is shown FIRST (A).
    Order (long, short): P(A) = .9;  order (short, long): P(A) = .2 + .1 = .3.
    Combined: P[long, short] = (.9 + 1 - .3) / 2 = .8 -- the bias cancels."""

    def srv_fn(path, body, attempt):
        text = body["messages"][0]["content"]
        a = text.split("[Response A]\n")[1].split("\n\n[Response B]")[0]
        b = text.split("[Response B]\n")[1].split("\n\nBetter")[0]
        p_a = (0.8 if len(a) > len(b) else 0.2) + 0.1
        top = [{"token": "A", "logprob": math.log(p_a)}, {"token": " B", "logprob": math.log(1 - p_a)}]
        return 200, chat_reply("A", top), 0.0

    with FakeServer(srv_fn) as srv:
        cfg = JudgeConfig(type="pairwise_llm", base_url=srv.url)
        j = PairwiseLLMJudge(openai_client(srv.url), cfg)
        (v,) = j.preferences(["q"], [["x", "xxx", "xx"]])
    assert len(srv.requests) == 6 and all(b["logprobs"] and b["top_logprobs"] == 20 for _, b in srv.requests)
    P = v.matrix
    assert (
        P[1, 0].item() == pytest.approx(0.8)
        and P[2, 0].item() == pytest.approx(0.8)
        and P[1, 2].item() == pytest.approx(0.8)
    )
    assert win_rates(P).argmax().item() == 1 and v.abstained_pairs == 0


def test_pairwise_llm_judge_text_fallback_and_abstain():
    def srv_fn(path, body, attempt):
        text = body["messages"][0]["content"]
        a = text.split("[Response A]\n")[1].split("\n\n")[0]
        return 200, chat_reply("[[B]]" if a == "one" else "no idea"), 0.0

    with FakeServer(srv_fn) as srv:
        cfg = JudgeConfig(type="pairwise_llm", base_url=srv.url, use_logprobs=False)
        j = PairwiseLLMJudge(openai_client(srv.url), cfg)
        (v,) = j.preferences(["q"], [["one", "two"]])
    # (one, two) -> B: P_first = 0;  (two, one) -> abstain: single order gives P[two, one] = 1.
    assert v.matrix[1, 0].item() == 1.0 and v.abstained_pairs == 0 and j.stats.abstentions == 1


def test_a_null_completion_or_one_too_long_for_max_tokens_is_an_error_naming_the_server():
    # a null text is no completion (it was counted as a duplicate of another); 300k characters
    # cannot come from max_tokens=4 (at most 4 x 256 = 1024 characters)
    for text, needle in (
        (None, r"a choices\[\]\.text is None, not text"),
        ("x" * 300_000, r"a reply of 300000 characters for max_tokens=4 \(at most 1024"),
    ):
        reply = json.dumps({"choices": [{"index": 0, "text": "ok"}, {"index": 1, "text": text}]})
        with FakeServer(lambda p, b, a, reply=reply: (200, reply, 0.0)) as srv:
            c = openai_client(srv.url)
            with pytest.raises(
                EndpointError, match=rf"POST {srv.url}/completions failed after 1 try: bad response: {needle}"
            ):
                c.completions({"n": 2, "max_tokens": 4})
        assert c.stats.failures == 1
    reply = json.dumps({"choices": [{"index": 0, "text": "y" * 1024}]})
    with FakeServer(lambda p, b, a: (200, reply, 0.0)) as srv:
        assert openai_client(srv.url).completions({"n": 1, "max_tokens": 4})[0]["text"] == "y" * 1024


def test_an_llm_judge_reply_too_long_for_max_tokens_is_an_error_naming_the_server():
    """The chat route had no cap: 300k characters for max_new_tokens 4 were parsed for a score.
    The same check as for completions (4 x 256 = 1024 characters at most)."""
    for content, ok in (("7" + " " * 1023, True), ("7" + "x" * 299_999, False)):
        with FakeServer(lambda p, b, a, content=content: (200, chat_reply(content), 0.0)) as srv:
            judge = LLMRubricJudge(openai_client(srv.url), JudgeConfig(type="llm", base_url=srv.url, max_new_tokens=4))
            if ok:
                assert judge.score(["q"], [["a"]]) == [[7.0]]
                continue
            with pytest.raises(
                EndpointError,
                match=rf"POST {srv.url}/chat/completions failed after 1 try: bad "
                r"response: a reply of 300000 characters for max_tokens=4 \(at most 1024",
            ):
                judge.score(["q"], [["a"]])
