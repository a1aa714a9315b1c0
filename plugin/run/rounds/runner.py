"""The runner's named stages: each run once, its start and finish recorded in `pofe-run.json`.

An iterated run is a sequence of named stages (`prompts`, `round-<t>/preprocess`, `train`,
`merge`, `push`, `eval`, `tracker`). `StageRunner.run` is where every one of them is
skipped when recorded as done, announced, recorded as started, run, and recorded as
finished with the facts it returns; `StageRunner.command` is how a stage runs a process
(under the guard of `pofe.run.rounds.processes`, into its log file, holding the run's lock). A stage
that raises stays recorded as started, not finished, so the next run redoes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pofe.logs import Echo
from pofe.run.folder import RunState
from pofe.run.rounds.processes import run_logged

# What a stage's work returns: the facts its finish records (None: none).
Facts = Mapping[str, Any] | None


class StageRunner:
    """Runs a run's stages; made once per run.

    `echo` says what each stage does; `stream` copies the stages' output to the terminal as
    well as their logs; `keep_fds` stay open in every stage process (the run's lock, so a
    stage that outlives its runner still holds the output_dir).
    """

    def __init__(self, state: RunState, *, echo: Echo = print, stream: bool = True, keep_fds: tuple[int, ...] = ()):
        self.state = state
        self.echo = echo
        self.stream = stream
        self.keep_fds = keep_fds

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
    ) -> None:
        """Stage `name`: skipped when done; else echo `says`, record its start (with the facts
        in `started`), call `work()`, and record its finish with the facts `work` returns.

        `inputs` are what the stage's result depends on beyond the run's recipe (the
        evaluation's models, the tracker's numbers): recorded at its finish, and a finished
        stage recorded with other inputs runs again. Whatever `work` raises propagates,
        leaving the stage started and unfinished.
        """
        if self.done(name, inputs):
            return
        if says:
            self.echo(says)
        self.state.start(name, **(started or {}))
        facts = work() or {}
        self.state.finish(name, **(inputs or {}), **facts)

    def command(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        """Run `cmd` as a stage process (`run_logged`: under the guard, its output in `log`,
        holding `keep_fds`, `env` added to its environment); `StageFailed` naming `log` if it
        exits with an error."""
        run_logged(cmd, log, self.echo, self.stream, self.keep_fds, env)
