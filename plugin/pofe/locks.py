"""A folder one process writes at a time: `FolderLock`, an OS lock (`flock`) on a file in it.

The kernel releases a flock when the last process holding its descriptor ends, so a holder
that crashes never blocks the next one, and a child that inherits the descriptor holds it
too. The file names the holder (PID, host, start, command) for the refusal a second process
gets, and records a clean release (`ended`), so a record without one found unlocked is a
crashed holder's. Who may not share which folder, and what the refusal says, is the
caller's: `pofe.run.guards` (a run's output_dir), `pofe_candidates.pipeline` (a candidates
folder), `pofe.plugin` (`axolotl train`'s output_dir, `TRAIN_LOCK`). A reader that must not
start while a writer runs asks `holder`, which takes nothing.

Released on every ordinary end of the holder's process: by `release` (or the `with` block),
else at the interpreter's exit (`atexit`: a normal end, an uncaught exception, `sys.exit`), so
only a holder that was killed (SIGKILL, a crash of the interpreter, `os._exit`) leaves a
record the next holder takes over with a word. A lock acquired with `keep_file=False` removes
its file on release (a trained model's folder keeps no lock file to be uploaded with it); a
holder that opened the file before it was removed finds it gone once it gets the lock, and
opens the new one (`acquire`). Such a lock is not for children to inherit: a child still
holding the removed file locks no one out.

This module is a leaf: standard library only.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from pofe.errors import PofeError

# the file `axolotl train` of a POFE recipe holds in its output_dir while it trains
# (`pofe.plugin`), removed when it ends. Its leading "_": the Trainer's hub uploads of the
# output_dir (`push_to_hub`, `hub_strategy`) skip "_*" files, and they run while it is held.
TRAIN_LOCK = "_pofe-train.lock"


def alive(pid: int) -> bool:
    """Whether process `pid` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def describe(holder: dict) -> str:
    """The holder as the refusal names it: `PID 4121 on host gpu-3, started 2026-11-30 10:01:02`."""
    if "pid" not in holder:
        return "its record is unreadable"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started"]))
    return f"PID {holder['pid']} on host {holder['host']}, started {started}"


def here_and_gone(holder: dict) -> bool:
    """Whether the recorded holder has ended (cleanly, or its process is gone from this host):
    the lock is then held by a child that inherited it."""
    here = holder.get("host") == socket.gethostname()
    return "ended" in holder or (here and not alive(holder["pid"]))


class FolderLock:
    """The held lock; `fileno()` for children to inherit, `release()` when the work ends (else
    at the process's exit)."""

    def __init__(self, path: Path, fd: int, holder: dict, keep_file: bool = True):
        self.path = path
        self.holder = holder
        self.keep_file = keep_file
        self._fd: int | None = fd

    @classmethod
    def acquire(
        cls,
        path: Path,
        echo: Callable[[str], None],
        command: str,
        refuse: Callable[[dict], PofeError],
        keep_file: bool = True,
    ) -> FolderLock:
        """Take the lock for `command`, or raise `refuse(holder)` with the holder's record;
        says so when taking over from a holder that was killed. `keep_file=False`: the file is
        removed on release (its record then gone with it)."""
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise refuse(holder) from None
            if _still_at(fd, path):
                break
            os.close(fd)  # its holder removed the file we opened as it released it: open the new one
        previous = _read(fd)
        if previous and "ended" not in previous:
            echo(f"{path}: taking over from a run that ended without releasing it ({describe(previous)})")
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": command}
        lock = cls(path, fd, holder, keep_file)
        lock._write()
        atexit.register(lock._at_exit)
        return lock

    def fileno(self) -> int:
        return self._fd

    def release(self) -> None:
        """Record the clean end (or, `keep_file=False`, remove the file), then let go; once."""
        if self._fd is None:
            return
        atexit.unregister(self._at_exit)
        if self.keep_file:
            self.holder["ended"] = time.time()
            self._write()
        else:
            self.path.unlink(missing_ok=True)  # still held: whoever opened it retries (`acquire`)
        os.close(self._fd)  # children that still hold it keep it locked
        self._fd = None

    def _at_exit(self) -> None:
        """The release at the interpreter's exit, in the process that took the lock (a forked
        child runs its parent's exit handlers too: it must not release its parent's lock)."""
        if os.getpid() == self.holder["pid"]:
            self.release()

    def _write(self) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(self.holder).encode(), 0)

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder(path: Path) -> dict | None:
    """The record of the process holding `path`'s lock now; None when none does (or there is no
    such file). Takes no lock and writes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read(fd) or {"unreadable": ""}  # locked, its record not yet written
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _still_at(fd: int, path: Path) -> bool:
    """Whether the file open as `fd` is still the one at `path` (not removed nor replaced)."""
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino)


def _read(fd: int) -> dict:
    """The holder the file names: {} when empty (new), {"unreadable": ...} when cut short."""
    raw = os.pread(fd, 4096, 0)
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {"unreadable": raw[:80].decode(errors="replace")}
