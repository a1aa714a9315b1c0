"""Running one stage of a run as its own process, its output in a log file.

Every stage is a separate process, so generation and training never share one (nor their
GPU memory). A stage never outlives the runner: it runs under a small guard
(`python -m pofe.run.rounds.processes CMD...`, `guard`) that starts it in its own process group and
ends that group when the runner goes, however it goes (SIGKILL included).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pofe.errors import PofeError
from pofe.files import private_opener
from pofe.logs import Echo

# Seconds a stopped stage gets between SIGTERM and SIGKILL.
STOP_GRACE = 10.0


class StageFailed(PofeError, RuntimeError):
    """A stage's process exited with an error."""


def child_env() -> dict[str, str]:
    """The children's environment: this venv's bin first (`axolotl train` runs `accelerate`)."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def axolotl_command(*args: str) -> list[str]:
    """`axolotl ARGS...` from this environment (or `python -m axolotl.cli.main` without the script)."""
    exe = Path(sys.executable).parent / "axolotl"
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "axolotl.cli.main", *args]


def run_logged(
    cmd: list[str],
    log: Path,
    echo: Echo,
    stream: bool,
    keep_fds: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
) -> None:
    """Run `cmd` under `guard`; its output, secrets masked (`redact_text`), goes to `log` (and
    the terminal when `stream`).

    `keep_fds` stay open in the stage (the run's lock: held while any stage process lives);
    `env` is added to the stage's environment.
    """
    from pofe.preprocess.config import redact_text  # not in the guard process, which runs this module

    log.parent.mkdir(parents=True, exist_ok=True)
    shown = redact_text(" ".join(cmd))
    echo(f"$ {shown}   (log: {log})")
    guarded = [sys.executable, "-m", __name__, *cmd]
    with open(log, "w", encoding="utf-8", opener=private_opener) as f:  # it holds axolotl's dump of the recipe
        # The guard's stdin is a pipe this process never writes to: it reaches EOF exactly
        # when this process ends. Its own session keeps it out of signals sent to ours
        # (`kill -9 %1` kills the runner, and the guard then ends the stage).
        with subprocess.Popen(
            guarded,
            env={**child_env(), **(env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            pass_fds=keep_fds,
            start_new_session=True,
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = redact_text(line)  # axolotl logs the recipe (a served policy's --api-key among it)
                f.write(line)
                if stream:
                    sys.stdout.write(line)
        returncode = proc.returncode
    if returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise StageFailed(f"{shown} exited with {returncode}; last lines of {log}:\n{tail}")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the group has ended


def _set_at_eof(fd: int, event: threading.Event) -> None:
    # os.read, not sys.stdin: a daemon thread blocked in a buffered read aborts the exit
    while os.read(fd, 4096):
        pass
    event.set()


def _stop_group_when(stop: threading.Event, pgid: int) -> None:
    stop.wait()
    _signal_group(pgid, signal.SIGTERM)
    time.sleep(STOP_GRACE)  # the guard exits sooner when the stage does
    _signal_group(pgid, signal.SIGKILL)


def guard(cmd: list[str]) -> int:
    """Run `cmd` in its own process group and return its exit status (128 + n for signal n).

    The group (the stage and everything it started: `axolotl train` execs `accelerate`,
    which starts the trainer) gets SIGTERM, then SIGKILL after `STOP_GRACE` seconds, when
    this process's stdin reaches EOF (the runner has ended) or it gets SIGTERM, SIGINT or
    SIGHUP; whatever the stage leaves behind when it exits gets SIGKILL.
    """
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=_set_at_eof, args=(sys.stdin.fileno(), stop), daemon=True).start()
    # close_fds=False: the stage inherits this process's inheritable fds, the runner's lock among them
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, close_fds=False, start_new_session=True)
    threading.Thread(target=_stop_group_when, args=(stop, proc.pid), daemon=True).start()
    returncode = proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(guard(sys.argv[1:]))
