"""generate.serve: a real vLLM (CPU) server started for the stage's policy, stopped after it.

The server tests start vLLM from .venv-vllm (~30-60 s each on 2 cores); the config and
command tests need no server.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig, Sampling
from pofe_candidates.generators.served import (
    ServedGenerator,
    ServerExited,
    live_servers,
    lora_arguments,
    render_command,
)
from pofe_candidates.pipeline import SHARD_SEED_STRIDE, run_pipeline
from pofe_candidates.render import Rendered
from tests.vllm_server import VLLM_CPU_ENV, vllm_cpu_command

PROMPTS = [{"prompt": f"{i}+{i + 1}="} for i in range(8)]
SHARD_SIZE = 1  # a shard per prompt: a server killed after shard 1 leaves most shards to resume


def length_reward(prompt, response) -> float:
    return float(len(response))


JUDGE = JudgeConfig(type="python", function="tests.candidates.test_served:length_reward")


def _served(vllm_python, **kw) -> GenerateConfig:
    # in_flight 1: one request at a time (a served window is otherwise the server's max_num_seqs,
    # all 8 prompts here). The server then batches nothing across prompts, so what it batched cannot
    # change the samples, and a kill once shard 1 is written (within the watcher's 10 ms poll) lands
    # while shard 2's request runs (60-300 ms on 2 busy cores), not after the last answer.
    settings = dict(num_candidates=3, max_new_tokens=8, temperature=1.0, seed=3, dedupe=False, in_flight=1)
    return GenerateConfig(
        backend="openai",
        serve={
            "command": vllm_cpu_command(vllm_python),
            "env": VLLM_CPU_ENV,
            "ready_timeout": 300,
            "stop_timeout": 20,
        },
        **{**settings, **kw},
    )


def _pipeline(cfg: GenerateConfig, policy: Path, out: Path):
    return run_pipeline(
        PROMPTS,
        policy_path=str(policy),
        method="rrhf",
        generate=cfg,
        judge=JUDGE,
        candidates=CandidatesConfig(out_dir=str(out), shard_size=SHARD_SIZE, truncated="keep", progress=False),
    )


def _running(out: Path) -> list:
    """Servers this process started for the pipeline in `out` and has not stopped (the
    session's vllm_server fixture runs on beside them)."""
    return [s for s in live_servers() if s.log_path == out / "generate" / "server.log"]


def _shards(out: Path) -> list[dict]:
    return [
        json.loads(line)
        for f in sorted((out / "generate").glob("shard-*.jsonl"))
        for line in f.read_text().splitlines()
    ]


# ---- no server ------------------------------------------------------------------------------


def test_command_placeholders_filled_and_lora_flags_expanded():
    cfg = GenerateConfig(
        backend="openai",
        serve={"command": "/v/python -m srv --model {model} --port={port} {lora_modules} --tp {tensor_parallel_size}"},
    )
    words = render_command(
        cfg.serve.command,
        {"model": "/m", "port": "8123", "host": "h", "served_model_name": "p", "tensor_parallel_size": "2"},
        lora_arguments("policy", "/a", 24),
    )
    assert words == [
        "/v/python",
        "-m",
        "srv",
        "--model",
        "/m",
        "--port=8123",
        "--enable-lora",
        "--lora-modules",
        '{"name": "policy", "path": "/a"}',
        "--max-lora-rank",
        "32",
        "--tp",
        "2",
    ]
    # rank 16 or less: vLLM's default max rank serves it, no flag
    assert lora_arguments("policy", "/a", 8) == ["--enable-lora", "--lora-modules", '{"name": "policy", "path": "/a"}']
    assert render_command(
        cfg.serve.command,
        {"model": "/m", "port": "1", "host": "h", "served_model_name": "p", "tensor_parallel_size": "1"},
        [],
    )[5:7] == ["--port=1", "--tp"]


@pytest.mark.parametrize(
    "serve, base_url, backend, needle",
    [
        ({"command": "srv --model {model}"}, None, "openai", "must contain {port}"),
        ({"command": "srv {model} {port} {gpus}"}, None, "openai", "unknown placeholder(s) ['gpus']"),
        ({"command": "srv {model} {port} --lora={lora_modules}"}, None, "openai", "must be a word of its own"),
        ({"command": "srv '{model} {port}"}, None, "openai", "not a valid shell-quoted command line"),
        ({"command": "srv {model} {port}"}, "http://127.0.0.1:8000/v1", "openai", "remove base_url"),
        ({"command": "srv {model} {port}"}, None, "vllm", "needs generate.backend: openai"),
        (
            {"command": "srv {model} {port}", "port": 70000},
            None,
            "openai",
            "port: 70000 is out of range; set a whole number >= 0 and <= 65535",
        ),
    ],
)
def test_serve_config_errors(serve, base_url, backend, needle):
    with pytest.raises(ValidationError) as e:
        GenerateConfig(backend=backend, serve=serve, base_url=base_url)
    assert needle in str(e.value)


def test_openai_without_url_or_serve_points_at_serve():
    with pytest.raises(ValidationError, match="or generate.serve"):
        GenerateConfig(backend="openai")


def test_rounds_with_openai_need_serve():
    """An already running server (base_url) serves one policy, not each round's: refused for
    rounds > 1, pointing at generate.serve; with serve, iterated runs validate."""
    from pofe.args import PofeConfig

    judge = {"type": "python", "function": "tests.candidates.test_served:length_reward"}
    served = PofeConfig(
        method="rrhf",
        rounds=2,
        judge=judge,
        generate={"backend": "openai", "serve": {"command": "srv {model} {port}"}},
    )
    assert served.generate.serve.command == "srv {model} {port}"
    with pytest.raises(ValidationError, match="set generate.serve instead"):
        PofeConfig(
            method="rrhf",
            rounds=2,
            judge=judge,
            generate={"backend": "openai", "base_url": "http://127.0.0.1:8000/v1"},
        )


def test_lora_model_dir_is_sampled_through_the_served_adapter():
    """With an adapter loaded, a served policy samples base + adapter (the adapter folder is
    what the server gets); a bare base_url would sample the base: refused, pointing at serve."""
    from axolotl.utils.dict import DictDefault

    from pofe.data.candidates import sampling_policy

    cfg = DictDefault(base_model="/base", lora_model_dir="/adapter")
    served = GenerateConfig(backend="openai", serve={"command": "srv {model} {port} {lora_modules}"})
    assert sampling_policy(cfg, served) == "/adapter"
    with pytest.raises(ValueError, match="Set generate.serve"):
        sampling_policy(cfg, GenerateConfig(backend="openai", base_url="http://127.0.0.1:8000/v1"))


def test_adapter_policy_without_lora_placeholder_is_refused(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/base", "r": 8}))
    cfg = GenerateConfig(backend="openai", serve={"command": "srv --model {model} --port {port}"})
    before = live_servers()
    with pytest.raises(ValueError, match=r"is a PEFT adapter: add \{lora_modules\}"):
        ServedGenerator(cfg, str(tmp_path), tmp_path)
    assert live_servers() == before and not (tmp_path / "server.log").exists()  # refused before starting
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/base", "peft_type": "IA3"}))
    cfg = GenerateConfig(backend="openai", serve={"command": "srv --model {model} --port {port} {lora_modules}"})
    with pytest.raises(ValueError, match="adapter of type IA3; vLLM serves LoRA adapters only"):
        ServedGenerator(cfg, str(tmp_path), tmp_path)
    assert live_servers() == before and not (tmp_path / "server.log").exists()


def test_manifest_keeps_what_changes_samples_not_how_the_server_is_reached():
    """A stage that failed on ready_timeout resumes with a larger one; another command is
    another generation setting."""
    from pofe_candidates.manifest import generate_manifest

    def manifest(**serve):
        cfg = GenerateConfig(backend="openai", serve={"command": "srv {model} {port}", **serve})
        return generate_manifest(PROMPTS, policy_path="/p", generate=cfg, shard_size=1, prompt_column="prompt")

    assert manifest() == manifest(ready_timeout=1200, stop_timeout=5, port=8011, host="0.0.0.0")
    assert manifest() != manifest(command="srv {model} {port} --dtype bfloat16")
    assert manifest() != manifest(tensor_parallel_size=2)


def _gone(pid: int, timeout: float = 15.0) -> bool:
    """Whether process `pid` ends within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_stop_ends_the_servers_whole_session(tmp_path):
    """stop() reaches what the server started (vLLM's engine workers): here a grandchild."""
    from pofe_candidates.generators.served import ServerProcess

    server = ServerProcess(["sh", "-c", "sleep 600 & echo worker $!; wait"], tmp_path / "server.log", "http://x")
    deadline = time.monotonic() + 15
    while "worker " not in server.tail() and time.monotonic() < deadline:  # tail: after the command line
        time.sleep(0.05)
    worker = int(server.tail().split("worker ")[1].split()[0])
    server.stop()
    assert server.exit_code is not None and _gone(worker)
    assert server not in live_servers()


def test_server_dies_with_a_killed_parent(tmp_path):
    """A stage process killed outright (no atexit) takes its server along (PR_SET_PDEATHSIG)."""
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from pofe_candidates.generators.served import ServerProcess\n"
        "s = ServerProcess(['sleep', '600'], sys.argv[1], 'http://x')\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "server.log")], stdout=subprocess.PIPE, text=True
    )
    server_pid = int(parent.stdout.readline())
    time.sleep(0.5)  # the launcher has exec'd into the server
    assert not _gone(server_pid, timeout=0.1)
    parent.kill()
    parent.wait(timeout=30)
    assert _gone(server_pid)


def test_server_exiting_before_ready_fails_with_exit_code_and_log(tmp_path):
    cfg = GenerateConfig(backend="openai", serve={"command": "sh -c 'echo cannot load {model}; exit 3' {port}"})
    with pytest.raises(ServerExited) as e:
        ServedGenerator(cfg, "/no/such/model", tmp_path)
    message = str(e.value)
    assert "exited before it was ready (exit code 3)" in message
    assert "cannot load /no/such/model" in message and str(tmp_path / "server.log") in message


def test_server_not_serving_the_requested_name_is_refused_and_stopped(tmp_path):
    """A real HTTP server (python's http.server) whose /v1/models lists another model: POFE
    names what is served and what it would request, and stops the server."""
    import sys

    (tmp_path / "site" / "v1").mkdir(parents=True)
    (tmp_path / "site" / "v1" / "models").write_text(json.dumps({"data": [{"id": "other"}]}))
    command = f"{sys.executable} -m http.server {{port}} --bind {{host}} --directory {{model}}"
    cfg = GenerateConfig(backend="openai", serve={"command": command, "served_model_name": "policy"})
    before = live_servers()
    with pytest.raises(ValueError, match=r"serves \['other'\], not '/.*/site', the model POFE requests"):
        ServedGenerator(cfg, str(tmp_path / "site"), tmp_path)
    assert live_servers() == before  # stopped


# A server that guards /v1/models with an API key, as `vllm serve --api-key` does: 401 without it.
_KEYED_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port, key, model = int(sys.argv[1]), sys.argv[2], sys.argv[3]
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == f"Bearer {key}"
        body = json.dumps({"data": [{"id": model}]} if ok else {"error": "Unauthorized"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.parametrize("sent", ["the-key", "a-wrong-key", None])
def test_readiness_probe_sends_the_api_key_and_fails_at_once_when_refused(tmp_path, monkeypatch, sent):
    """Bad case 8: the probe of /v1/models sends the key from api_key_env; a 401 stops the
    wait at once (not after ready_timeout) and names api_key_env."""
    import sys

    (tmp_path / "server.py").write_text(_KEYED_SERVER)
    command = f"{sys.executable} {tmp_path / 'server.py'} {{port}} the-key {{model}}"
    if sent is not None:
        monkeypatch.setenv("POFE_TEST_KEY", sent)
    cfg = GenerateConfig(
        backend="openai",
        api_key_env="POFE_TEST_KEY" if sent else None,
        serve={"command": command, "ready_timeout": 20},
    )
    before = live_servers()
    if sent == "the-key":
        gen = ServedGenerator(cfg, str(tmp_path), tmp_path)
        gen.close()
        return
    start = time.monotonic()
    with pytest.raises(PermissionError) as e:
        ServedGenerator(cfg, str(tmp_path), tmp_path)
    assert time.monotonic() - start < 15  # at once, not after ready_timeout
    message = str(e.value)
    assert "HTTP 401" in message and "api_key_env" in message
    if sent:
        assert "POFE_TEST_KEY" in message and sent not in message  # the variable named, the key never shown
    assert live_servers() == before  # stopped


# ---- a real vLLM server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference_run(vllm_python, tiny_policy, tmp_path_factory) -> Path:
    """The served pipeline run to the end without interruption (its out_dir)."""
    out = tmp_path_factory.mktemp("served") / "reference"
    _pipeline(_served(vllm_python), tiny_policy, out)
    return out


@pytest.mark.vllm
def test_served_pipeline_equals_direct_server_and_stops_it(reference_run, vllm_server, vllm_python, tiny_policy):
    """Shard s was sampled with seed + s * SHARD_SEED_STRIDE + i for its prompt i: asking an
    independently started server (the session fixture, same model and settings) with those
    seeds gives the same candidates, each cut where it began a user turn (the tiny template's
    turn opens with its one `<|user|>` token, which the server's text leaves out). The server is
    gone after the stage."""
    from pofe_candidates.generators import make_generator
    from pofe_candidates.generators.interface import sampled_ids
    from pofe_candidates.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_policy))
    user = tokenizer.convert_tokens_to_ids("<|user|>")

    def as_kept(candidate) -> str:
        ids = sampled_ids(candidate)
        return tokenizer.decode(ids[: ids.index(user)], skip_special_tokens=True) if user in ids else str(candidate)

    cfg = _served(vllm_python)
    base, model = vllm_server
    direct = make_generator(cfg.model_copy(update={"serve": None, "base_url": base, "model": model}), model)
    for shard in _shards(reference_run):
        s = shard["index"] // SHARD_SIZE
        sampling = dataclasses.replace(cfg.sampling(), seed=cfg.seed + s * SHARD_SEED_STRIDE)
        prompt = Rendered(shard["rendered"], len(shard["prompt_ids"]), ids=shard["prompt_ids"])
        (expected,) = direct.generate([prompt], cfg.num_candidates, sampling)
        kept = [as_kept(c) for c in expected]
        assert shard["candidates"] == [c for c in kept if c.strip()]  # the stage drops empty ones
    summary = json.loads((reference_run / "summary.json").read_text())
    assert summary["generate_client_requests_last_run"]["requests"] == len(PROMPTS)
    assert summary["generate_client_requests_last_run"]["failures"] == 0
    log = (reference_run / "generate" / "server.log").read_text()
    assert "=== POFE" in log and "--served-model-name policy" in log
    assert _running(reference_run) == []


@pytest.mark.vllm
def test_server_killed_mid_stage_fails_clearly_and_rerun_resumes(reference_run, vllm_python, tiny_policy, tmp_path):
    """SIGKILL the server once shard 1 is written: the stage fails naming the command, the exit
    code and the log; a rerun starts a new server, does only the missing shards, and writes the
    uninterrupted run's data.jsonl byte for byte."""
    out = tmp_path / "resumed"
    killed = []

    def kill_after_shard_1():
        deadline = time.monotonic() + 400
        while not (out / "generate" / "shard-00001.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        for server in _running(out):
            os.killpg(server.pid, signal.SIGKILL)
            killed.append(server.pid)

    watcher = threading.Thread(target=kill_after_shard_1, daemon=True)
    watcher.start()
    with pytest.raises(ServerExited) as e:
        _pipeline(_served(vllm_python), tiny_policy, out)
    watcher.join()
    message = str(e.value)
    assert killed and ("exited while generating" in message or "exited before this batch" in message)
    assert "exit code -9 (signal SIGKILL)" in message
    assert "vllm.entrypoints.openai.api_server --model" in message
    assert str(out / "generate" / "server.log") in message and "run the stage again to resume" in message
    assert _running(out) == []
    written = len(list((out / "generate").glob("shard-*.jsonl")))
    assert 2 <= written < len(PROMPTS)

    result = _pipeline(_served(vllm_python), tiny_policy, out)
    requests = json.loads(result.summary_path.read_text())["generate_client_requests_last_run"]["requests"]
    assert requests == len(PROMPTS) - written  # only the missing shards were generated
    assert result.data_path.read_bytes() == (reference_run / "data.jsonl").read_bytes()
    assert _running(out) == []
    assert (out / "generate" / "server.log").read_text().count("=== POFE") == 2  # both starts logged


@pytest.mark.vllm
def test_adapter_served_as_lora_module_matches_peft(vllm_python, tiny_policy, tmp_path):
    """A PEFT adapter policy is served as a LoRA module on its base (no merge): greedy answers
    equal peft's base + adapter, and differ from the base's."""
    from tests.candidates._lora import greedy_answers, strong_adapter
    from tests.candidates._vllm_inprocess_driver import PROMPTS, rendered

    adapter = strong_adapter(tiny_policy, tmp_path / "adapter")
    with_adapter = greedy_answers(tiny_policy, PROMPTS, adapter)
    assert with_adapter != greedy_answers(tiny_policy, PROMPTS)
    gen = ServedGenerator(_served(vllm_python), str(adapter), tmp_path)
    try:
        answers = gen.generate(rendered(tiny_policy, PROMPTS), 1, Sampling(temperature=0.0, max_new_tokens=8))
    finally:
        gen.close()
    assert [a[0] for a in answers] == with_adapter
    log = (tmp_path / "server.log").read_text()
    assert f"--model {tiny_policy}" in log and "--enable-lora" in log and "--served-model-name policy-base" in log
    assert gen.server.exit_code is not None  # stopped
