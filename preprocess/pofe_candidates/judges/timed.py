"""A python judge's calls in a worker process, so a call past `judge.timeout` can be stopped.

A thread cannot be killed and `signal.alarm` works on the main thread only (the judge stage may
run in a worker thread or process), so a judge function that never returns hung the stage for
good. With `judge.timeout` (seconds per call) or `judge.stage_timeout` (seconds for all of this
judge's calls in one stage) set, each call runs in a forked worker process that is terminated
when its time is up, and the stage stops with an error naming the judge, the row and the key.
The worker is forked (it inherits the loaded function, so lambdas and functions from local files
work) and kept between calls: the cost is a pipe round trip per call (measured on a loaded 2-core
machine, 2,000 calls of a trivial function: 0.017 ms a call direct, 0.086 ms in the worker).
A timeout is an error, not an abstention, whatever `judge.allow_abstain` says: a hung judge is a
broken judge, and skipping its candidates one timeout at a time would take the stage for ever.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

from pofe.errors import PofeError
from pofe_candidates.judges.interface import JudgeError, row_place


class JudgeTimeout(JudgeError):
    """A judge call ran past its time: the stage stops (abstaining would hide a hung judge)."""

    def __init__(self, reason: str, where: str, *, prompt: int | None = None, row: int | str | None = None):
        super().__init__(reason, where, prompt=prompt, row=row)
        place = row_place(row, prompt)
        self.args = (f"judge timed out on {f'{place}, ' if place else ''}{where}: {reason}",)

    def at_row(self, row: int | str) -> JudgeTimeout:
        return JudgeTimeout(self.reason, self.where, row=row)


class RemoteError(PofeError):
    """The judge function raised in the worker: `str(self)` is "Type: message"."""


def timed(fn: Callable, name: str, timeout: float | None, stage_timeout: float | None) -> Callable:
    """`fn`, run in a worker process that can be stopped when a time limit is set."""
    if timeout is None and stage_timeout is None:
        return fn
    return TimedCalls(fn, name=name, timeout=timeout, stage_timeout=stage_timeout)


class TimedCalls:
    """`fn(*args)` in a worker process, within `timeout` seconds a call and `stage_timeout` in all."""

    def __init__(self, fn: Callable, *, name: str, timeout: float | None, stage_timeout: float | None):
        self.fn, self.name, self.timeout, self.stage_timeout = fn, name, timeout, stage_timeout
        self._deadline = None if stage_timeout is None else time.monotonic() + stage_timeout
        self._proc = self._conn = None

    def __call__(self, args: tuple, *, where: str, prompt: int | None) -> Any:
        if self._proc is None:
            self._start()
        wait, key, limit = self._wait()
        self._conn.send(args)
        if not self._conn.poll(max(wait, 0.0)):
            self.close()
            raise JudgeTimeout(
                f"python judge {self.name} did not return within {key}={limit:g} s (the call was stopped); "
                f"raise {key} if it is slow, or fix the function if it hangs",
                where,
                prompt=prompt,
            )
        ok, value = self._conn.recv()
        if not ok:
            raise RemoteError(value)
        return value

    def _wait(self) -> tuple[float, str, float]:
        """Seconds this call may take, the key that bounds it, and that key's value."""
        left = None if self._deadline is None else self._deadline - time.monotonic()
        if left is not None and (self.timeout is None or left < self.timeout):
            return left, "judge.stage_timeout", self.stage_timeout
        return self.timeout, "judge.timeout", self.timeout

    def _start(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(self.fn, child), daemon=True)
        self._proc.start()
        child.close()

    def close(self) -> None:
        """Stop the worker (a hung call with it); the next call starts a new one."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.join(5)
            self._conn.close()
        self._proc = self._conn = None


def _serve(fn: Callable, conn) -> None:
    """The worker: call `fn` on each args received, send back (True, result) or (False, why)."""
    while True:
        try:
            args = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, fn(*args)))
        except Exception as e:  # a user function (or an unpicklable result): the parent abstains or raises
            conn.send((False, f"{type(e).__name__}: {e}"))
