"""`pofe.locks.FolderLock` (issue 50): released on every ordinary end of its process, so only a
killed holder leaves a record the next one takes over with a word; a lock that removes its file
(`axolotl train`'s, `TRAIN_LOCK`) leaves none in a trained model's folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pofe import locks
from pofe.locks import TRAIN_LOCK, FolderLock, holder

# A holder in a process of its own: takes the lock, says its PID, then ends as argv[3] says
HOLDER = """
import os, sys
from pathlib import Path
from pofe.locks import FolderLock
removes = {"keep_file": False} if sys.argv[2] == "remove" else {}
lock = FolderLock.acquire(Path(sys.argv[1]), print, "test", RuntimeError, **removes)
print(os.getpid(), flush=True)
end = sys.argv[3]
if end == "raise":
    raise RuntimeError("the training failed")
if end == "exit":
    sys.exit(3)
if end == "wait":
    sys.stdin.read()
"""


def run_holder(path: Path, keep: str, end: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", HOLDER, str(path), keep, end], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(("end", "returncode"), [("raise", 1), ("exit", 3), ("return", 0)])
def test_a_holder_that_ends_without_releasing_releases_at_exit(tmp_path, end, returncode):
    """A run that failed (an exception, `sys.exit(3)`) or ended without calling `release` used
    to leave a record without `ended`: the next run said "taking over from a run that ended
    without releasing it". Now the process's exit releases it: the record says `ended` and the
    next holder says nothing; a lock that removes its file leaves none."""
    path = tmp_path / "folder.lock"
    proc = run_holder(path, "keep", end)
    assert proc.returncode == returncode, proc.stderr
    pid = int(proc.stdout.split()[0])
    record = json.loads(path.read_text())
    assert (record["pid"], record["command"]) == (pid, "test") and "ended" in record
    said = []
    FolderLock.acquire(path, said.append, "next", RuntimeError).release()
    assert said == []

    removed = tmp_path / TRAIN_LOCK
    assert run_holder(removed, "remove", end).returncode == returncode
    assert not removed.exists()


def test_a_killed_holder_is_taken_over_with_a_word(tmp_path):
    """SIGKILL runs no exit handler: the record stays without `ended`, the kernel frees the
    lock, and the next holder takes over naming the killed one (a removable lock's file stays
    too: the next holder says the same)."""
    for name, keep in (("folder.lock", "keep"), (TRAIN_LOCK, "remove")):
        path = tmp_path / name
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path), keep, "wait"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        pid = int(proc.stdout.readline())
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        said = []
        FolderLock.acquire(path, said.append, "next", RuntimeError).release()
        (line,) = said
        assert line.startswith(
            f"{path}: taking over from a run that ended without releasing it (PID {pid} on host {socket.gethostname()}"
        )


def test_a_forked_child_does_not_release_its_parents_lock(tmp_path):
    """A forked child inherits the exit handlers: its exit must not release (nor remove) the
    lock its parent still holds."""
    path = tmp_path / TRAIN_LOCK
    script = """
import os, sys
from pathlib import Path
from pofe.locks import FolderLock, holder
lock = FolderLock.acquire(Path(sys.argv[1]), print, "test", RuntimeError, keep_file=False)
child = os.fork()
if child == 0:
    sys.exit(0)
os.waitpid(child, 0)
print(holder(Path(sys.argv[1]))["pid"] == os.getpid(), flush=True)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env)
    assert (proc.returncode, proc.stdout) == (0, "True\n"), proc.stderr
    assert not path.exists()


def test_a_lock_file_removed_while_opened_is_not_locked_twice(tmp_path, monkeypatch):
    """The holder of a removable lock releases (removes the file, then lets go) just after a
    second process opened the file: the second must not lock the removed file, which a third
    would not see, but the new one at the path."""
    path = tmp_path / TRAIN_LOCK
    first = FolderLock.acquire(path, print, "first", RuntimeError, keep_file=False)
    real_open = os.open

    def open_then_first_releases(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        first.release()
        return fd

    monkeypatch.setattr(locks.os, "open", open_then_first_releases)
    second = FolderLock.acquire(path, print, "second", RuntimeError, keep_file=False)
    monkeypatch.undo()
    assert path.exists() and holder(path)["command"] == "second"
    with pytest.raises(RuntimeError):
        FolderLock.acquire(path, print, "third", RuntimeError)
    second.release()
    assert not path.exists()


def test_a_finished_training_leaves_no_lock_file_in_its_output_dir(tmp_path):
    """`axolotl train`'s lock (`PofePlugin`) is held while it trains and removed at its end:
    push_to_hub uploaded `pofe-train.lock` (PID, host, command) with the model. While it is
    there its name starts with "_", which the Trainer's hub uploads skip."""
    from pofe.plugin import PofePlugin

    cfg = SimpleNamespace(output_dir=str(tmp_path / "out"))
    plugin = PofePlugin()
    plugin._hold_output_dir(cfg)
    assert TRAIN_LOCK.startswith("_") and holder(tmp_path / "out" / TRAIN_LOCK)["command"] == "axolotl train"
    plugin.post_train_unload(cfg)
    assert os.listdir(tmp_path / "out") == []
