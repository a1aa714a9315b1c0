"""One runner per output_dir: `<output_dir>/pofe-run.lock`.

An OS lock (`flock`) on the file, so a holder that crashes never blocks the next run: the
kernel releases the lock when the last process holding it ends. Stages inherit it
(`pofe.run.stages.run_logged`'s `keep_fds`), so a trainer that outlives its runner still
holds it. The file names the holder (PID, host, start) for the error a second run gets,
and records a clean release (`ended`), so a record without one found unlocked is a
crashed run's.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from .stages import Echo


class RunLocked(RuntimeError):
    """Another runner (or a stage it started) holds the output_dir."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _describe(holder: dict) -> str:
    if "pid" not in holder:
        return "its record is unreadable"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
    return f"PID {holder['pid']} on host {holder['host']}, started {started}"


def _locked_message(path: Path, holder: dict) -> str:
    here = holder.get("host") == socket.gethostname()
    if "ended" in holder or (here and not _alive(holder["pid"])):
        return (
            f"{path.parent} is locked by a stage process of an `axolotl pofe run` that has ended "
            f"({_describe(holder)}); the stage is being stopped. Wait for it to exit "
            f"(`fuser -v {path}` lists it), then run again."
        )
    stop = f" (kill {holder['pid']})" if here else ""
    return (
        f"{path.parent} is in use by another `axolotl pofe run` ({_describe(holder)}); two runs "
        f"on one output_dir would overwrite each other's files. Wait for it to finish, or stop "
        f"it{stop}, then run again."
    )


class RunLock:
    """The held lock; `fileno()` for the stages to inherit, `release()` when the run ends."""

    def __init__(self, path: Path, fd: int, holder: dict):
        self.path = path
        self.holder = holder
        self._fd = fd

    @classmethod
    def acquire(cls, path: Path, echo: Echo) -> RunLock:
        """Take the lock or raise `RunLocked` naming the holder; says so when taking over
        from a crashed run."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise RunLocked(_locked_message(path, holder)) from None
        previous = _read(fd)
        if previous and "ended" not in previous:
            echo(f"{path}: taking over from a run that ended without releasing it ({_describe(previous)})")
        lock = cls(path, fd, {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
        lock._write()
        return lock

    def fileno(self) -> int:
        return self._fd

    def release(self) -> None:
        self.holder["ended"] = time.time()
        self._write()
        os.close(self._fd)  # stages that still hold it keep it locked

    def _write(self) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(self.holder).encode(), 0)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> dict:
    """The holder the file names: {} when empty (new), {"unreadable": ...} when cut short."""
    raw = os.pread(fd, 4096, 0)
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {"unreadable": raw[:80].decode(errors="replace")}
