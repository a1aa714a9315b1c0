"""The window on servers POFE did not start (server_window.py): read from each server's
/v1/models, a documented default where it says nothing, and `in_flight` over both."""

from __future__ import annotations

import json
import socket

import pytest

from pofe_candidates.config import GenerateConfig, JudgeConfig
from pofe_candidates.generators import make_generator
from pofe_candidates.judges.llm import LLMRubricJudge
from pofe_candidates.replicas import client_for
from pofe_candidates.server_window import OTHER_WINDOW, VLLM_WINDOW
from tests.openai_server import VLLM_MODELS, FakeServer, chat_reply

LOGGER = "axolotl.integrations.pofe_candidates.server_window"
VLLM = (200, json.dumps(VLLM_MODELS))
# what api.openai.com answers: model cards owned by an organisation, not by vllm
NOT_VLLM = (200, json.dumps({"object": "list", "data": [{"id": "gpt-x", "object": "model", "owned_by": "system"}]}))


def _chat(path, body, attempt):
    return 200, chat_reply("7"), 0.0


def _generator(urls, **kw):
    return make_generator(GenerateConfig(backend="openai", base_url=urls, **kw), "policy")


def test_a_vllm_server_gets_vllm_s_max_num_seqs(caplog):
    with FakeServer(_chat, models=VLLM) as srv, caplog.at_level("INFO", logger=LOGGER):
        gen = _generator(srv.url)
    assert VLLM_WINDOW == 256 and gen.concurrency == 256
    assert srv.gets == ["/v1/models"] and srv.requests == []  # one GET; no completion was sent
    assert caplog.messages == [
        f"POFE: {srv.url} is a vLLM server: 256 requests in flight there; set generate.in_flight to change it"
    ]


def test_servers_that_do_not_say_get_the_default_with_one_line_each(caplog):
    """Three servers: one without /v1/models (404), one that fails (500), one that answers as
    a paid API does: 32 each; one vLLM server beside them: 256. 3 x 32 + 256 = 352."""
    with (
        FakeServer(_chat) as none,
        FakeServer(_chat, models=(500, "boom")) as failing,
        FakeServer(_chat, models=NOT_VLLM) as paid,
        FakeServer(_chat, models=VLLM) as vllm,
        caplog.at_level("INFO", logger=LOGGER),
    ):
        gen = _generator([none.url, failing.url, paid.url, vllm.url])
    assert OTHER_WINDOW == 32 and gen.concurrency == 352
    tail = "the default for a server that does not say what it runs; set generate.in_flight to change it"
    assert caplog.messages == [
        f'POFE: {none.url}/models did not answer (HTTP 404: {{"error": "not found"}}): 32 requests in flight there, '
        + tail,
        f"POFE: {failing.url}/models did not answer (HTTP 500: boom): 32 requests in flight there, " + tail,
        f"POFE: {paid.url} is not a vLLM server (no model card owned_by vllm): 32 requests in flight there; "
        "set generate.in_flight to change it",
        f"POFE: {vllm.url} is a vLLM server: 256 requests in flight there; set generate.in_flight to change it",
    ]
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO", "INFO"]


def test_an_unreachable_server_gets_the_default(caplog):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with caplog.at_level("INFO", logger=LOGGER):
        assert _generator(url).concurrency == 32
    assert len(caplog.messages) == 1
    assert caplog.messages[0].startswith(f"POFE: {url}/models did not answer (ConnectError: ")


def test_an_explicit_in_flight_wins_and_asks_nothing(caplog):
    with FakeServer(_chat, models=VLLM) as srv, caplog.at_level("INFO", logger=LOGGER):
        gen = _generator(srv.url, in_flight=5)
    assert gen.concurrency == 5 and srv.gets == [] and caplog.messages == []


def _judge(srv, **kw):
    return LLMRubricJudge(
        client_for(JudgeConfig(type="llm", base_url=srv.url)), JudgeConfig(type="llm", base_url=srv.url, **kw)
    )


@pytest.mark.parametrize(("models", "window"), [(VLLM, 256), ((404, "{}"), 32), (NOT_VLLM, 32)])
def test_the_llm_judge_s_window_is_read_from_the_server(models, window, caplog):
    with FakeServer(_chat, models=models) as srv, caplog.at_level("INFO", logger=LOGGER):
        judge = _judge(srv)
        assert judge.window is None  # nothing asked before the first verdict
        assert judge.score(["q"], [["a", "b"]]) == [[7.0, 7.0]]
    assert judge.window == window and srv.gets == ["/v1/models"]
    assert len(caplog.messages) == 1 and caplog.messages[0].endswith("set judge.in_flight to change it")


def test_the_llm_judge_s_explicit_in_flight_wins():
    with FakeServer(_chat, models=VLLM) as srv:
        judge = _judge(srv, in_flight=3)
        judge.score(["q"], [["a", "b"]])
    assert judge.window == 3 and srv.gets == []


def test_batch_size_no_longer_sets_a_server_s_window():
    """batch_size was the window per server: refused there, with the in_flight that keeps it."""
    with pytest.raises(
        ValueError, match=r"generate.batch_size applies to backend: transformers.*in_flight: 10 instead"
    ):
        GenerateConfig(backend="openai", base_url=["http://a:1/v1", "http://b:2/v1"], batch_size=5)
    with pytest.raises(
        ValueError, match=r"judge.batch_size applies to judge.type: reward_model / pairrm / gpm.*in_flight: 3 instead"
    ):
        JudgeConfig(type="llm", base_url="http://a:1/v1", batch_size=3)
    with pytest.raises(
        ValueError, match="judge.in_flight applies to judge.type: llm / pairwise_llm, not to judge.type: reward_model"
    ):
        JudgeConfig(type="reward_model", model="m", in_flight=3)
    assert GenerateConfig(batch_size=5).batch_size == 5  # transformers
    assert JudgeConfig(type="reward_model", model="m", batch_size=3).batch_size == 3
