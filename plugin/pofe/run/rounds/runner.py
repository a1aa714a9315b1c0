"""The runner's named stages: each run once, its start and finish recorded in `pofe-run.json`.

An iterated run is a sequence of named stages (`prompts`, `round-<t>/preprocess`, `train`,
`merge`, `push`, `eval`, `tracker`). `StageRunner.run` is where every one of them is
skipped when recorded as done, announced, recorded as started, run, and recorded as
finished with the facts it returns; `StageRunner.command` is how a stage runs a process
(under the guard of `pofe.run.rounds.processes`, into its log file, holding the run's lock). A stage
that raises stays recorded as started, not finished, so the next run redoes it.
"""

from __future__ import annotations

import shutil
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pofe.errors import PofeError
from pofe.logs import Echo
from pofe.run.folder import RunState
from pofe.run.guards import LOCK_FD_ENV
from pofe.run.rounds.processes import StageFailed, output_to, run_logged

# What a stage's work returns: the facts its finish records (None: none).
Facts = Mapping[str, Any] | None


class StatusLine:
    """One line at the bottom of the terminal (stderr), rewritten by each call: the running
    stage's progress bar; "" clears it."""

    @staticmethod
    def possible() -> bool:
        return sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        width = shutil.get_terminal_size().columns
        sys.stderr.write("\r\x1b[K" + text[: width - 1])  # to the line's start, erase it, write
        sys.stderr.flush()


def shown_path(path: Path, root: Path) -> str:
    """A path of the run as the console shows it: relative to the run's folder `root` (said once,
    as the run starts) when under it."""
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def duration(seconds: float) -> str:
    """`41 s`, `3 min 05 s`, `2 h 04 min`."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class StageRunner:
    """Runs a run's stages; made once per run.

    `echo` says what each stage does and what it made; `stream` copies the stages' output to
    `echo` as well as their logs; `progress` (a terminal's status line) shows their progress
    bars; `keep_fds` stay open in every stage process (the run's lock first, so a stage that
    outlives its runner still holds the output_dir, and one that reads the run, the eval
    stage, reads it under that lock: `pofe.run.guards.holding_run`).
    """

    def __init__(
        self,
        state: RunState,
        *,
        echo: Echo = print,
        stream: bool = True,
        keep_fds: tuple[int, ...] = (),
        progress: Echo | None = None,
    ):
        self.state = state
        self.echo = echo
        self.stream = stream
        self.keep_fds = keep_fds
        self.env = {LOCK_FD_ENV: str(keep_fds[0])} if keep_fds else {}
        self.progress = progress
        self.logs: list[Path] = []  # the logs of the stage running now

    def done(self, name: str, inputs: Mapping[str, Any] | None = None) -> bool:
        """Whether stage `name` is recorded as finished, with the same `inputs` when given."""
        record = self.state.stages.get(name, {})
        return self.state.done(name) and all(record.get(k) == v for k, v in (inputs or {}).items())

    def run(
        self,
        name: str,
        work: Callable[[], Facts],
        *,
        says: str | None = None,
        started: Mapping[str, Any] | None = None,
        inputs: Mapping[str, Any] | None = None,
        made: Callable[[Mapping[str, Any]], str] | None = None,
    ) -> None:
        """Stage `name`: skipped when done; else echo `says`, record its start (with the facts
        in `started`), call `work()`, record its finish with the facts `work` returns, and, for
        a stage that `says`, echo how long it took, `made(facts)` and its logs.

        `inputs` are what the stage's result depends on beyond the run's recipe (the
        evaluation's models, the tracker's numbers): recorded at its finish, and a finished
        stage recorded with other inputs runs again. Whatever `work` raises propagates,
        leaving the stage started and unfinished (a `StageFailed` names the stage).
        """
        if self.done(name, inputs):
            return
        if says:
            self.echo(says)
        self.state.start(name, **(started or {}))
        outer, self.logs = self.logs, []  # a stage may run another (the stop check runs eval)
        try:
            facts = work() or {}
        except StageFailed as e:
            e.stage = e.stage or name
            raise
        finally:
            logs, self.logs = self.logs, outer
        self.state.finish(name, **(inputs or {}), **facts)
        if says:
            what = f": {made(facts)}" if made else ""
            where = "".join(f"; log {shown_path(log, self.state.path.parent)}" for log in logs)
            self.echo(f"  done in {duration(self.state.stages[name]['seconds'])}{what}{where}")

    def command(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        """Run `cmd` as a stage process (`run_logged`: under the guard, its output in `log`,
        holding `keep_fds`, `env` added to its environment); `StageFailed` with the stage's
        error and `log` if it exits with an error."""
        self.logs.append(log)
        run_logged(cmd, log, self.echo, self.stream, self.keep_fds, {**self.env, **(env or {})}, self.progress)

    @contextmanager
    def in_process(self, log: Path) -> Iterator[None]:
        """Work of the running stage done in this process: its output (file descriptors 1 and 2,
        `output_to`) goes to `log`, which the stage's end line names, as a stage process's does;
        an exception's traceback goes there too, and `StageFailed` says what it was and where.
        With `stream`, the output stays on the console (no log)."""
        if self.stream:
            yield
            return
        self.logs.append(log)
        try:
            with output_to(log, self.echo):
                yield
        except Exception as e:
            with log.open("a", encoding="utf-8") as f:
                f.write(traceback.format_exc())
            what = str(e) if isinstance(e, PofeError) else f"{type(e).__name__}: {e}"
            raise StageFailed(f"{what}\n(the stage's whole output, traceback included: {log})") from e
