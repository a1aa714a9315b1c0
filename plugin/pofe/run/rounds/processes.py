"""Running one stage of a run as its own process, its output in a log file.

Every stage is a separate process, so generation and training never share one (nor their
GPU memory). A stage never outlives the runner: it runs under a small guard
(`python -m pofe.run.rounds.processes CMD...`, `guard`) that starts it in its own process group and
ends that group when the runner goes, however it goes (SIGKILL included).
"""

from __future__ import annotations

import codecs
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from pofe.errors import ERROR_FILE_ENV, PofeError
from pofe.files import private_opener
from pofe.logs import Echo, logger_name

# Seconds a stopped stage gets between SIGTERM and SIGKILL.
STOP_GRACE = 10.0


class StageFailed(PofeError, RuntimeError):
    """A stage's process exited with an error; `stage` names the run's stage it failed in
    (set by `pofe.run.rounds.runner.StageRunner.run`)."""

    stage: str | None = None

    def __str__(self) -> str:
        return f"{self.stage} failed: {super().__str__()}" if self.stage else super().__str__()


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


# What a stage prints: lines end in "\n" ("\r\n" too); a progress bar (tqdm) redraws its line
# after a "\r"
_SEPARATOR = re.compile(r"(\r\n|\r|\n)")
# A warning POFE logs in a stage (axolotl's log format, a logger under `pofe.logs.logger_name`):
# about the user's run, so the console shows it; library warnings stay in the log
_POFE_WARNING = re.compile(
    r"^\[[^\]]*\] \[(?:WARNING|ERROR)\] \[" + re.escape(logger_name("pofe")) + r"[\w.]*\] (.*)$"
)
# Where the stage's first traceback ends: the exception's line, unindented
_TRACEBACK = "Traceback (most recent call last):"
# what starts the traceback after it: a chained exception's, a launcher's
_NEXT_TRACEBACK = (_TRACEBACK, "During handling of the above exception", "The above exception was the direct cause")


def output_events(stream: BinaryIO) -> Iterator[tuple[str, bool]]:
    """A stage's output as it arrives: (text, True) for each line, (text, False) for each state
    of a progress bar, the line a `\r` redraws (shown as soon as it is read, then again when
    the next redraw ends it). Bytes that are not UTF-8 are replaced, not fatal."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending, redrawn = "", False
    while chunk := stream.read1(65536):
        text = pending + decoder.decode(chunk)
        held = text.endswith("\r")  # it may be the first half of "\r\n"
        parts = _SEPARATOR.split(text[:-1] if held else text)
        pending = parts.pop() + ("\r" if held else "")
        for segment, separator in zip(parts[::2], parts[1::2]):
            redrawn = separator == "\r"
            if not redrawn:
                yield segment, True
            elif segment.strip():
                yield segment, False
        if redrawn and pending.strip("\r").strip():
            yield pending.rstrip("\r"), False
    tail = (pending + decoder.decode(b"", final=True)).rstrip("\r")
    if tail.strip():
        yield tail, True


def pofe_warning(line: str) -> str | None:
    """A POFE warning's message in a line of a stage's output, else None."""
    found = _POFE_WARNING.match(line)
    return found[1] if found else None


def first_error(log: Path) -> str:
    """The error a failed stage's log shows: the exception line(s) of its first traceback (the
    stage's own; launchers add theirs after it), else its last lines."""
    lines = log.read_text(errors="replace").splitlines()[1:]  # below the command line that heads it
    if _TRACEBACK in lines:
        after = lines[lines.index(_TRACEBACK) + 1 :]
        start = next((i for i, line in enumerate(after) if line and not line[0].isspace()), None)
        if start is not None:
            message = []
            for line in after[start : start + 6]:  # a message of a few lines, up to a blank or the next traceback
                if not line.strip() or line.startswith(_NEXT_TRACEBACK):
                    break
                message.append(line)
            return "\n".join(message)
    return "\n".join(line for line in lines[-10:] if line.strip())


def run_logged(
    cmd: list[str],
    log: Path,
    echo: Echo,
    stream: bool,
    keep_fds: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
    progress: Echo | None = None,
) -> None:
    """Run `cmd` under `guard`; its output, secrets masked (`redact_text`), goes to `log`,
    headed by the command line.

    `stream`: every line also goes to `echo` (else only POFE's warnings, `pofe_warning`, which
    are about the user's run). `progress` (a status line on a terminal) gets each
    state of the stage's progress bars, and "" when the stage ends; the log keeps each bar's
    last state only. `keep_fds` stay open in the stage (the run's lock: held while any stage
    process lives); `env` is added to the stage's environment. A stage that fails raises
    `StageFailed` with its POFE error's message (`pofe.errors.record_error`), else the first
    error its log shows, and the log's path.
    """
    from pofe_candidates.config import redact_text  # not in the guard process, which runs this module

    log.parent.mkdir(parents=True, exist_ok=True)
    shown = redact_text(" ".join(cmd))
    error_file = log.with_name(f"{log.name}.error")
    error_file.unlink(missing_ok=True)
    if stream:
        echo(f"$ {shown}")
    guarded = [sys.executable, "-m", __name__, *cmd]
    with open(log, "w", encoding="utf-8", opener=private_opener) as f:  # it holds axolotl's dump of the recipe
        f.write(f"$ {shown}\n")
        f.flush()
        # The guard's stdin is a pipe this process never writes to: it reaches EOF exactly
        # when this process ends. Its own session keeps it out of signals sent to ours
        # (`kill -9 %1` kills the runner, and the guard then ends the stage).
        with subprocess.Popen(
            guarded,
            env={**child_env(), **(env or {}), ERROR_FILE_ENV: str(error_file)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=keep_fds,
            start_new_session=True,
        ) as proc:
            assert proc.stdout is not None
            bar_shown = False
            for text, is_line in output_events(proc.stdout):
                text = redact_text(text)  # axolotl logs the recipe (a served policy's --api-key among it)
                if is_line:
                    f.write(text + "\n")
                    f.flush()  # `tail -f` follows the stage as it runs
                    warning = None if stream else pofe_warning(text)
                    if stream or warning:
                        if bar_shown:  # a printed line replaces the bar, which the next state redraws
                            progress("")
                            bar_shown = False
                        echo(text if stream else f"  warning: {warning}")
                elif progress is not None:
                    progress(text.strip())
                    bar_shown = True
        if progress is not None:
            progress("")
        returncode = proc.returncode
    if returncode != 0:
        error = (
            error_file.read_text() if error_file.exists() else f"{shown} exited with {returncode}:\n{first_error(log)}"
        )
        raise StageFailed(f"{error}\n(the stage's whole output, traceback included: {log})")


@contextmanager
def output_to(path: Path, echo: Echo) -> Iterator[None]:
    """This process's own output (file descriptors 1 and 2: Python's streams, the logging
    handlers that write to them, C libraries) appended to `path` for the block, then back;
    POFE's warnings among it (`pofe_warning`) then go to `echo` as well."""
    path.parent.mkdir(parents=True, exist_ok=True)
    start = path.stat().st_size if path.exists() else 0
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "a", encoding="utf-8", opener=private_opener) as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        for fd, saved_fd in zip((1, 2), saved):
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
        for line in path.read_bytes()[start:].decode("utf-8", errors="replace").splitlines():
            if (warning := pofe_warning(line)) is not None:
                echo(f"warning: {warning}")


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
