"""The stage-wide in-flight window (generators/stream.py) and several servers behind one
client (replicas.py), without a model: scripted engines and fake HTTP servers."""

from __future__ import annotations

import json
import threading
import time

import pytest

from pofe_candidates.config import GenerateConfig, JudgeConfig
from pofe_candidates.generators import make_generator
from pofe_candidates.generators.openai import OpenAIGenerator
from pofe_candidates.generators.served import served_capacity
from pofe_candidates.generators.stream import ShardJob, run_window
from pofe_candidates.judges.llm import LLMRubricJudge
from pofe_candidates.openai_client import EndpointError
from pofe_candidates.render import Rendered
from pofe_candidates.replicas import ReplicaClient, client_for
from pofe_candidates.shards import judged_in_turn
from tests.openai_server import FakeServer, chat_reply, completions_ok, openai_client


def _jobs(sizes, seed=0):
    sampling = GenerateConfig(num_candidates=2, seed=seed).sampling()
    return [
        ShardJob(s, [Rendered(f"p{s}.{i}", 2, ids=[s, i]) for i in range(k)], sampling) for s, k in enumerate(sizes)
    ]


class ScriptedEngine:
    """An engine whose prompt (shard, i) takes `steps[shard][i]` steps; one step per wait()."""

    def __init__(self, steps):
        self.steps, self.clock, self.running, self.log = steps, 0, {}, []

    def submit(self, job, i):
        self.running[(job.key, i)] = self.clock + self.steps[job.key][i]
        self.log.append(("submit", job.key, i, self.clock))

    def wait(self):
        self.clock += 1
        done = sorted(k for k, t in self.running.items() if t <= self.clock)
        for k in done:
            del self.running[k]
        return [(s, i, [f"c{s}.{i}"]) for s, i in done]


def test_window_tops_up_from_later_shards_and_yields_each_shard_when_its_last_prompt_ends():
    # shard 0 has a long tail (prompt 1: 10 steps); window 3: shards 0 and 1 enter at once
    # (2 < 3 prompts after shard 0), shard 2 when shard 1 ends at step 2 (1 left in flight),
    # all while 0.1 still runs
    engine = ScriptedEngine({0: [1, 10], 1: [2, 2], 2: [1]})
    out = list(run_window(_jobs([2, 2, 1]), 3, engine.submit, engine.wait))
    assert [k for k, _ in out] == [1, 2, 0]
    assert dict(out) == {0: [["c0.0"], ["c0.1"]], 1: [["c1.0"], ["c1.1"]], 2: [["c2.0"]]}
    submitted_at = {(s, i): t for _, s, i, t in engine.log}
    assert submitted_at == {(0, 0): 0, (0, 1): 0, (1, 0): 0, (1, 1): 0, (2, 0): 2}
    assert engine.clock == 10  # the tail alone sets the end: nothing waited for shard 0 to drain


def test_window_of_one_shard_at_a_time_and_empty_shards():
    engine = ScriptedEngine({0: [3], 2: [1]})
    jobs = _jobs([1, 0, 1])
    out = list(run_window(jobs, 1, engine.submit, engine.wait))
    assert out == [(0, [["c0.0"]]), (1, []), (2, [["c2.0"]])]
    assert [t for *_, t in engine.log] == [0, 3]  # window 1: shard 2 only after shard 0
    with pytest.raises(ValueError, match="at least 1 prompt"):
        list(run_window(jobs, 0, engine.submit, engine.wait))


def test_openai_stream_keeps_the_window_full_across_shards():
    """Shard 0's prompt 0 is slow: with a window of 3, shard 1's requests are sent while it
    runs, and shard 1 comes out first; the candidates are those of each shard alone."""
    started = []

    def slow_first(path, body, attempt):
        started.append(tuple(body["prompt"]))
        status, text, _ = completions_ok(path, body, attempt)
        return status, text, 0.6 if body["prompt"] == [0, 0] else 0.05

    with FakeServer(slow_first) as srv:
        gen = OpenAIGenerator(openai_client(srv.url), "m", concurrency=3)
        jobs = _jobs([2, 2], seed=7)
        out = list(gen.generate_stream(jobs, 2))
        alone = [gen.generate(j.prompts, 2, j.sampling) for j in jobs]
    assert [k for k, _ in out] == [1, 0]
    assert dict(out) == {0: alone[0], 1: alone[1]}
    assert set(started[:4]) == {(0, 0), (0, 1), (1, 0), (1, 1)}  # all four sent before 0.0 answered


def test_base_url_lists_are_checked():
    cfg = GenerateConfig(backend="openai", base_url=["http://a:1/v1", "http://b:2/v1"])
    assert cfg.base_url == ["http://a:1/v1", "http://b:2/v1"]
    with pytest.raises(ValueError, match="empty list"):
        GenerateConfig(backend="openai", base_url=[])
    with pytest.raises(ValueError, match="more than once"):
        GenerateConfig(backend="openai", base_url=["http://a:1/v1", "http://a:1/v1"])
    with pytest.raises(ValueError, match="credentials"):
        JudgeConfig(type="llm", base_url=["http://a:1/v1", "http://u:p@b:2/v1"], rubric="{response}")
    with pytest.raises(ValueError, match="in_flight: 0 is out of range; set a whole number >= 1 and <= 1000000"):
        GenerateConfig(in_flight=0)


def test_served_capacity_reads_max_num_seqs():
    assert served_capacity(["vllm", "serve", "m", "--max-num-seqs", "48"]) == 48
    assert served_capacity(["vllm", "serve", "m", "--max-num-seqs=12"]) == 12
    assert served_capacity(["vllm", "serve", "m"]) == 256  # vLLM's default on most GPUs


def test_a_list_of_servers_shares_one_window():
    cfg = GenerateConfig(backend="openai", base_url=["http://a:1/v1", "http://b:2/v1"], in_flight=64)
    gen = make_generator(cfg, "m")
    assert gen.concurrency == 64 and isinstance(gen.client, ReplicaClient)


def test_a_dead_server_s_requests_go_to_the_others_and_samples_do_not_change():
    """Two servers, one of which is gone: every prompt is answered by the live one, with the
    candidates one live server alone gives (the seed travels with the request)."""
    with FakeServer(completions_ok) as gone:
        dead_url = gone.url  # closed on leaving: connections are refused
    with FakeServer(completions_ok) as live:
        client = ReplicaClient([openai_client(dead_url, max_retries=1), openai_client(live.url)])
        jobs = _jobs([3, 2], seed=11)
        both = dict(OpenAIGenerator(client, "m", concurrency=4).generate_stream(jobs, 2))
        one = dict(OpenAIGenerator(openai_client(live.url), "m", concurrency=4).generate_stream(jobs, 2))
    assert both == one and sorted(both) == [0, 1]
    assert client.dead == {0}
    assert client.stats.failures >= 1 and client.stats.retries >= 1  # the dead one's, counted for the stage


def test_requests_are_spread_over_live_servers_and_4xx_is_not_failed_over():
    seen = {0: 0, 1: 0}
    lock = threading.Lock()

    def counting(k):
        def behaviour(path, body, attempt):
            with lock:
                seen[k] += 1
            time.sleep(0.05)
            return completions_ok(path, body, attempt)

        return behaviour

    with FakeServer(counting(0)) as a, FakeServer(counting(1)) as b:
        client = client_for(GenerateConfig(backend="openai", base_url=[a.url, b.url], max_retries=0))
        list(OpenAIGenerator(client, "m", concurrency=4).generate_stream(_jobs([4, 4]), 2))
    assert seen[0] + seen[1] == 8 and min(seen.values()) >= 3, seen

    # one request at a time (every server idle at each pick): ties go round, 4 and 4, not 8 and 0
    seen.update({0: 0, 1: 0})
    with FakeServer(counting(0)) as a, FakeServer(counting(1)) as b:
        client = client_for(GenerateConfig(backend="openai", base_url=[a.url, b.url], max_retries=0))
        list(OpenAIGenerator(client, "m", concurrency=1).generate_stream(_jobs([4, 4]), 2))
    assert seen == {0: 4, 1: 4}

    bad = FakeServer(lambda path, body, attempt: (400, json.dumps({"error": "bad"}), 0.0))
    with bad, FakeServer(completions_ok) as ok:
        client = ReplicaClient([openai_client(bad.url), openai_client(ok.url)])
        client.busy = [0, 1]  # the bad one is picked first
        with pytest.raises(EndpointError, match="HTTP 400"):
            client.completions({"n": 1})
    assert client.dead == set()


def test_judged_in_turn_yields_shards_as_they_finish_and_cancels_the_rest_on_close():
    """Side by side, a shard held back does not hold back the next; closing early cancels the
    shards not started (they would otherwise go on judging after an error)."""
    release, second_busy, started = threading.Event(), threading.Event(), []

    def work(s):
        started.append(s)
        if s == 2:
            second_busy.set()
        if s != 1:
            assert release.wait(30)
        return 10 * s

    assert list(judged_in_turn([0, 1, 2], lambda s: 10 * s)) == [(0, 0), (1, 10), (2, 20)]
    shards = judged_in_turn([0, 1, 2, 3, 4, 5], work, side_by_side=2)
    assert next(shards) == (1, 10)  # shard 0 waits: shard 1 (on the second worker) comes out first
    # the second worker takes shard 2 some time after shard 1 is out (a loaded run closed before it
    # had, and shard 2 was cancelled too): wait for it, so both workers hold a shard and 3-5 queue
    assert second_busy.wait(30)
    # lets 0 and 2 finish once close() has cancelled 3-5 (microseconds after it is called; the
    # second's margin is for a loaded machine)
    threading.Timer(1.0, release.set).start()
    shards.close()
    assert sorted(started) == [0, 1, 2]


def test_llm_judge_window_stays_full_across_shards():
    """Two shards judged side by side share the judge's one window of 3 requests: shard 1's
    requests go out while shard 0's slow candidate runs, shard 1 is judged first, no more than 3
    requests are ever in flight, and each shard scores as it does alone."""
    lock, live, peak, log = threading.Lock(), [0], [0], []

    def serve(path, body, attempt):
        text = body["messages"][0]["content"]
        response = text.split("[Response]\n")[1].split("\n")[0]
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            log.append(("start", response, time.monotonic()))
        time.sleep(1.0 if response == "slow" else 0.02)
        with lock:
            live[0] -= 1
            log.append(("end", response, time.monotonic()))
        return 200, chat_reply(f"Score: {len(response)}"), 0.0

    shards = {0: (["q0"], [["slow", "ab", "abc"]]), 1: (["q1"], [["a", "abcd", "abcde", "ab", "abc", "abcdef"]])}
    with FakeServer(serve) as srv:
        judge = LLMRubricJudge(openai_client(srv.url), JudgeConfig(type="llm", base_url=srv.url, in_flight=3))
        assert judge.overlaps_shards
        out = list(judged_in_turn([0, 1], lambda s: judge.score(*shards[s]), side_by_side=2))
    assert [s for s, _ in out] == [1, 0]
    assert dict(out) == {0: [[4.0, 2.0, 3.0]], 1: [[1.0, 4.0, 5.0, 2.0, 3.0, 6.0]]}
    assert peak[0] <= 3
    slow_end = next(t for kind, r, t in log if kind == "end" and r == "slow")
    assert all(t < slow_end for kind, r, t in log if kind == "end" and r in ("a", "abcd", "abcde", "abcdef"))
