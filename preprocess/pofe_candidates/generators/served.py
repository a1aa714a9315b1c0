"""A served policy: an OpenAI-compatible server started for the stage's policy, then stopped.

`generate.backend: openai` with `generate.serve.command` set: POFE fills the command's
placeholders for the policy it samples from (`{model}`, `{port}`, ...), starts the server,
waits until its `/models` answers, generates through the `openai` backend, and stops the
server when the generate stage ends or fails. A run of several rounds thus serves each
round's policy, from a venv of its own (vLLM often pins another torch than training's).

A policy that is a PEFT adapter (a folder with adapter_config.json) is served as a vLLM LoRA
module on its base (`{lora_modules}`), as the in-process vllm backend sends a LoRARequest,
instead of being merged first. Online training (`pofe.online`) keeps one server of the base
up for the run instead (`ServedGenerator.loading_adapters`) and loads each refresh's adapter
into it while it runs.

Lifecycle: the server runs in a session of its own (stopping it reaches the engine workers
it spawns, and nothing else), writes to `server.log` in the stage folder (appended: a
resumed stage keeps the crashed server's log), gets SIGTERM and then SIGKILL after
`serve.stop_timeout` seconds when stopped, is stopped at interpreter exit, and gets SIGTERM
from the kernel if this process dies without exiting cleanly (PR_SET_PDEATHSIG; strictly, when
the thread that started it ends, so servers are started from the stage's own thread).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

from pofe.errors import PofeError
from pofe.files import private_opener
from pofe_candidates.config import GenerateConfig, Sampling, read_api_key, redact_text, resolve_env
from pofe_candidates.config.credentials import command_secrets, env_reference
from pofe_candidates.generators.adapters import max_lora_rank, read_adapter
from pofe_candidates.generators.openai import OpenAIGenerator
from pofe_candidates.generators.stream import ShardJob, one_job
from pofe_candidates.openai_client import EndpointError, OpenAIClient, status_hint
from pofe_candidates.render import Rendered
from pofe_candidates.server_window import VLLM_WINDOW

LOG_NAME = "server.log"
# vLLM's switch for its /v1/load_lora_adapter and /v1/unload_lora_adapter routes
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

# Run by this interpreter between fork and the server's exec: ask the kernel for SIGTERM
# when this process dies (it survives exec), then become the server. If this process died
# before the request took effect, the parent is already someone else: exit.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class ServerExited(PofeError, RuntimeError):
    """The served policy's server exited (before it was ready, or while generating)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def lora_arguments(name: str, adapter_path: str, rank: int) -> list[str]:
    """vLLM's flags serving `adapter_path` as LoRA module `name` (the rank rounded up to a
    value vLLM accepts when above its default of 16)."""
    args = ["--enable-lora", "--lora-modules", json.dumps({"name": name, "path": str(adapter_path)})]
    rank = max_lora_rank(rank, adapter_path)
    return args if rank is None else [*args, "--max-lora-rank", str(rank)]


def served_capacity(command: list[str]) -> int:
    """Prompts to keep in flight on a served policy: the command's `--max-num-seqs` (vLLM's
    sequences per batch), else `VLLM_WINDOW` (vLLM's default on most GPUs). One per sequence
    slot, not slots / n: a prompt whose n samples end at different lengths holds fewer slots
    than n near its end, and the server queues what it cannot run yet, at no cost."""
    for k, word in enumerate(command):
        value = (
            word.partition("=")[2]
            if word.startswith("--max-num-seqs=")
            else (command[k + 1] if word == "--max-num-seqs" and k + 1 < len(command) else None)
        )
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return VLLM_WINDOW


def render_command(template: str, values: dict[str, str], lora_args: list[str]) -> list[str]:
    """The command's words with placeholders filled; the word `{lora_modules}` becomes
    `lora_args` (several words, or none). The template was checked by ServeConfig."""
    words = []
    for word in shlex.split(template):
        if word == "{lora_modules}":
            words += lora_args
        else:
            words.append(word.format(**values))
    return words


class ServerProcess:
    """An HTTP server started from `command` in its own session, logging to `log_path`.

    Its output reaches the log through `_copy_redacted`, and the command through
    `redact_text`: the command's keys (`--api-key X`) and the given `secrets` are masked
    wherever they appear (vLLM prints its arguments when it starts)."""

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        base_url: str,
        *,
        env: dict[str, str] | None = None,
        stop_timeout: float = 30.0,
        secrets: tuple[str, ...] = (),
    ):
        self.command, self.log_path, self.base_url, self.stop_timeout = command, Path(log_path), base_url, stop_timeout
        self.secrets = (*command_secrets(command), *secrets)
        full_env = {**os.environ, **(env or {})}
        full_env.pop("PYTHONPATH", None)  # never mix this venv's packages into the server's
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", opener=private_opener) as log:
            log.write(f"\n=== POFE {datetime.now(UTC).isoformat(timespec='seconds')}: {self.shown_command}\n")
            self._log_start = log.tell()
        launcher = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command]
        self.proc = subprocess.Popen(
            launcher,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
        self._copier = threading.Thread(
            target=_copy_redacted, args=(self.proc.stdout, self.log_path, self.secrets), daemon=True
        )
        self._copier.start()
        _LIVE.add(self)

    @property
    def shown_command(self) -> str:
        return redact_text(shlex.join(self.command), self.secrets)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exit_code(self) -> int | None:
        """None while running; else the exit status (negative: killed by that signal)."""
        return self.proc.poll()

    def wait_ready(self, timeout: float, *, api_key: str | None = None, key_env: str | None = None) -> list[str]:
        """Poll `{base_url}/models` until it answers 200; the served model ids. Sends `api_key`
        as the completion requests do (vLLM's --api-key guards /v1/models too). Raises
        ServerExited if the server exits first, PermissionError at once on HTTP 401/403 (the
        key is missing or wrong: waiting will not help), TimeoutError after `timeout` seconds."""
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        deadline = time.monotonic() + timeout
        while True:
            if self.exit_code is not None:
                raise ServerExited(self.describe("exited before it was ready"))
            with contextlib.suppress(httpx.TransportError, ValueError):
                r = httpx.get(f"{self.base_url}/models", headers=headers, timeout=5)
                if r.status_code in (401, 403):
                    raise PermissionError(
                        self.describe(
                            f"answered HTTP {r.status_code} to {self.base_url}/models. "
                            + status_hint(r.status_code, key_env=key_env, model=None)
                        )
                    )
                if r.status_code == 200:
                    body = r.json()
                    models = body.get("data") if isinstance(body, dict) else None
                    return [m.get("id") for m in models if isinstance(m, dict)] if isinstance(models, list) else []
            if time.monotonic() > deadline:
                raise TimeoutError(
                    self.describe(
                        f"did not answer {self.base_url}/models within {timeout:.0f} s (generate.serve.ready_timeout)"
                    )
                )
            time.sleep(1)

    def tail(self, lines: int = 40) -> str:
        """The last lines this start wrote to the log."""
        if self.exit_code is not None:
            self._copier.join(timeout=5)  # the server's last lines, copied before they are shown
        with open(self.log_path, errors="replace") as f:
            f.seek(self._log_start)
            return "".join(f.read().splitlines(keepends=True)[-lines:])

    def describe(self, what: str) -> str:
        code = self.exit_code
        status = (
            "running"
            if code is None
            else f"exit code {code}"
            + (f" (signal {signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else "")
        )
        return f"the server `{self.shown_command}` {what} ({status}); last lines of {self.log_path}:\n{self.tail()}"

    def stop(self) -> None:
        """SIGTERM the server's session, SIGKILL it after stop_timeout seconds; then SIGKILL
        whatever is left of the session (engine workers outliving the server)."""
        _LIVE.discard(self)
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)
                break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _copy_redacted(stream, log_path: Path, secrets: tuple[str, ...]) -> None:
    """Append `stream`'s lines to `log_path` as they come, each with its secrets masked."""
    with stream, open(log_path, "a", encoding="utf-8") as log:
        for line in stream:
            log.write(redact_text(line.decode("utf-8", errors="replace"), secrets))
            log.flush()


_LIVE: set[ServerProcess] = set()


@atexit.register
def _stop_live_servers() -> None:
    for server in list(_LIVE):
        server.stop()


def live_servers() -> list[ServerProcess]:
    """Servers started and not yet stopped in this process."""
    return list(_LIVE)


def served_names(serve, policy_path: str) -> tuple[str, list[str], str, str]:
    """(the model the server loads, its LoRA arguments, the name it serves the model under,
    the name requests use) for `policy_path`: a full model, or a LoRA adapter served on its base."""
    adapter = read_adapter(policy_path)
    if adapter is None:
        request_name = serve.served_model_name if "{served_model_name}" in serve.command else policy_path
        return policy_path, [], serve.served_model_name, request_name
    if "{lora_modules}" not in shlex.split(serve.command):
        raise ValueError(
            f"the policy {policy_path} is a PEFT adapter: add {{lora_modules}} to generate.serve.command "
            "(vLLM then serves it as a LoRA module on its base), or merge it into its base first."
        )
    if adapter.get("peft_type", "LORA") != "LORA":
        raise ValueError(
            f"the policy {policy_path} is a PEFT adapter of type {adapter['peft_type']}; vLLM serves LoRA adapters "
            "only: merge it into its base first."
        )
    lora_args = lora_arguments(serve.served_model_name, policy_path, adapter["r"])
    return adapter["base_model_name_or_path"], lora_args, f"{serve.served_model_name}-base", serve.served_model_name


class ServedGenerator:
    """The `openai` backend against a server started here for `policy_path`; `close()` stops it.

    Requests name `serve.served_model_name`, which is the LoRA module when the policy is an
    adapter (the base is then served as `<name>-base`), else the served model's name; a
    command without {served_model_name} serves a full model under its path, so requests
    name that path.
    """

    name = "served"

    def __init__(self, cfg: GenerateConfig, policy_path: str, workdir: str | Path | None = None):
        if cfg.serve is None:
            raise ValueError("ServedGenerator needs generate.serve")
        model, lora_args, served_name, request_name = served_names(cfg.serve, policy_path)
        self._start(cfg, model, lora_args, served_name, request_name, workdir)

    @classmethod
    def loading_adapters(
        cls, cfg: GenerateConfig, model: str, rank: int | None, workdir: str | Path
    ) -> ServedGenerator:
        """A server of the full model `model` that loads LoRA adapters up to rank `rank` while it
        runs (vLLM's /v1/load_lora_adapter, which VLLM_ALLOW_RUNTIME_LORA_UPDATING turns on; its
        --enable-lora and --max-lora-rank fill {lora_modules}). Requests name the model until
        `inner.model` names an adapter loaded."""
        serve = cfg.serve.model_copy(update={"env": {**cfg.serve.env, RUNTIME_LORA_ENV: "True"}})
        model, _, served_name, request_name = served_names(serve, model)
        generator = cls.__new__(cls)
        lora_args = ["--enable-lora", *(["--max-lora-rank", str(rank)] if rank is not None else [])]
        generator._start(cfg.model_copy(update={"serve": serve}), model, lora_args, served_name, request_name, workdir)
        return generator

    def _start(self, cfg, model: str, lora_args: list[str], served_name: str, request_name: str, workdir) -> None:
        """Start the server of `model` and wait until it serves `request_name` (stopped if it does not)."""
        serve = cfg.serve
        port = serve.port or free_port(serve.host)
        command = render_command(
            serve.command,
            {
                "model": model,
                "port": str(port),
                "host": serve.host,
                "served_model_name": served_name,
                "tensor_parallel_size": str(serve.tensor_parallel_size),
            },
            lora_args,
        )
        base_url = f"http://{serve.host}:{port}/v1"
        log_dir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="pofe-serve-"))
        env, api_key = resolve_env(serve.env), read_api_key(cfg.api_key_env)
        passed = tuple(env[k] for k, v in serve.env.items() if env_reference(v))  # the ${NAME} references' values
        self.server = ServerProcess(
            command,
            log_dir / LOG_NAME,
            base_url,
            env=env,
            stop_timeout=serve.stop_timeout,
            secrets=(*passed, *((api_key,) if api_key else ())),
        )
        try:
            served = self.server.wait_ready(serve.ready_timeout, api_key=api_key, key_env=cfg.api_key_env)
            if request_name not in served:
                raise ValueError(
                    self.server.describe(
                        f"serves {served}, not {request_name!r}, the model POFE requests: pass "
                        "--served-model-name {served_model_name} (and {lora_modules}) in generate.serve.command"
                    )
                )
        except BaseException:
            self.server.stop()
            raise
        client_cfg = cfg.model_copy(update={"base_url": base_url})
        self.inner = OpenAIGenerator(
            OpenAIClient.from_config(client_cfg),
            request_name,
            concurrency=cfg.in_flight or served_capacity(command),
            prompt_as=cfg.openai_prompt,
        )

    @property
    def client(self) -> OpenAIClient:
        return self.inner.client  # its request counts go to summary.json

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[str]]:
        return one_job(self.generate_stream, prompts, n, sampling)

    def generate_stream(self, jobs: Iterable[ShardJob], n: int) -> Iterator[tuple[int, list[list[str]]]]:
        """The inner backend's stream (one window for the stage); a server that exited is
        named with its log's last lines."""
        if self.server.exit_code is not None:
            raise ServerExited(self.server.describe("exited before this batch") + _RESUME_HINT)
        try:
            yield from self.inner.generate_stream(jobs, n)
        except EndpointError as e:
            if self.server.exit_code is None:
                raise
            raise ServerExited(self.server.describe("exited while generating") + _RESUME_HINT) from e

    def close(self) -> None:
        self.server.stop()


_RESUME_HINT = "\nThe finished shards are kept: run the stage again to resume from them."
