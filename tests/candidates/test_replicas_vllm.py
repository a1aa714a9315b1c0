"""Two vLLM CPU servers behind `generate.base_url`: the candidates are one server's, and a
server killed mid-stage loses nothing (its prompts are answered by the other).

The session's server (conftest `vllm_server`) is one of the two; this module starts the
second, so the file costs one more server start (~30-60 s on 2 cores).
"""

from __future__ import annotations

import os
import signal

import pytest

from pofe_candidates import generate_stage
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generators import make_generator
from pofe_candidates.generators.served import ServerProcess, free_port
from pofe_candidates.pipeline import run_pipeline
from pofe_candidates.replicas import ReplicaClient
from tests.vllm_server import VLLM_CPU_ENV

pytestmark = pytest.mark.vllm

PROMPTS = [{"prompt": f"{a}+{b}="} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (8, 3)]]


@pytest.fixture(scope="module")
def second_server(vllm_python, tiny_policy, tmp_path_factory):
    """A second server of the tiny policy, as tests/vllm_server.py starts one (killable here)."""
    port = free_port()
    cmd = [
        str(vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_policy),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "256",
    ]
    server = ServerProcess(
        cmd, tmp_path_factory.mktemp("vllm-b") / "server.log", f"http://127.0.0.1:{port}/v1", env=VLLM_CPU_ENV
    )
    try:
        server.wait_ready(300)
        yield server
    finally:
        server.stop()


def _run(urls, model, policy, out_dir, generator=None, in_flight=4):
    cfg = GenerateConfig(
        backend="openai",
        base_url=urls,
        model=model,
        num_candidates=2,
        max_new_tokens=8,
        temperature=1.0,
        seed=3,
        in_flight=in_flight,
        max_retries=1,
        request_timeout=60,
    )
    gen = generator or make_generator(cfg, policy)
    res = run_pipeline(
        PROMPTS,
        method="rrhf",
        generate=cfg,
        judge=JudgeConfig(type="python", function="pofe.demo.task:reward"),
        candidates=CandidatesConfig(out_dir=str(out_dir), shard_size=2, progress=False),
        policy_path=policy,
        generator=gen,
    )
    return res.data_path.read_bytes(), gen


@pytest.fixture(scope="module")
def one_server_data(vllm_server, tiny_policy, tmp_path_factory):
    base, model = vllm_server
    return _run(base, model, str(tiny_policy), tmp_path_factory.mktemp("one"))[0]


def test_two_servers_give_one_server_s_data(vllm_server, second_server, tiny_policy, one_server_data, tmp_path):
    base, model = vllm_server
    data, gen = _run([base, second_server.base_url], model, str(tiny_policy), tmp_path)
    assert data == one_server_data
    assert isinstance(gen.client, ReplicaClient) and gen.client.dead == set()
    assert gen.client.stats.requests == 8  # every prompt once: no retries
    assert gen.client.stats.failures == 0


def test_a_server_killed_mid_stage_loses_nothing(
    vllm_server, second_server, tiny_policy, one_server_data, tmp_path, monkeypatch
):
    """The second server is SIGKILLed when the first shard is written: every prompt is still
    answered, and data.jsonl is unchanged. With a window of 1 (a whole shard is handed over at a
    time), the next shard is handed over only after that write: all 6 later prompts are sent
    after the kill, each shard's two to two idle servers, one each, so the dead server is picked
    and found. (A window of 4 failed here once under load: every later request had been sent,
    and answered, before the write that kills.)"""
    base, model = vllm_server
    write, writes = generate_stage.write_jsonl_atomic, []

    def write_then_kill(path, rows):
        write(path, rows)
        writes.append(path)
        if len(writes) == 1:
            os.killpg(second_server.pid, signal.SIGKILL)
            second_server.proc.wait(30)

    monkeypatch.setattr(generate_stage, "write_jsonl_atomic", write_then_kill)
    data, gen = _run([base, second_server.base_url], model, str(tiny_policy), tmp_path, in_flight=1)
    assert second_server.exit_code == -signal.SIGKILL
    assert len(writes) == 4
    assert data == one_server_data
    assert gen.client.dead == {1}
