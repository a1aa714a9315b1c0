"""One runner per output_dir: `pofe.run.guards.RunLock` (pofe-run.lock)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from pofe.run.guards import RunLock, RunLocked

# A runner that crashes: takes the lock, starts a "stage" that inherits it and lives until
# the test closes its stdin, prints both PIDs and exits without releasing the lock.
CRASHING_RUNNER = """
import os, subprocess, sys
from pathlib import Path
from pofe.run.guards import RunLock
lock = RunLock.acquire(Path(sys.argv[1]), print)
stage = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], pass_fds=(lock.fileno(),))
print(os.getpid(), stage.pid, flush=True)
os._exit(0)
"""


def test_second_runner_refused_while_the_first_lives(tmp_path):
    """flock conflicts between two opens of the file even in one process, so this process
    plays both runners; the second is told who holds the run and how to stop it."""
    path = tmp_path / "pofe-run.lock"
    said = []
    first = RunLock.acquire(path, said.append)
    record = json.loads(path.read_text())
    assert (record["pid"], record["host"]) == (os.getpid(), socket.gethostname())
    with pytest.raises(RunLocked) as err:
        RunLock.acquire(path, said.append)
    message = str(err.value)
    assert (
        f"{tmp_path} is in use by another `axolotl pofe run` (PID {os.getpid()} on host {socket.gethostname()}"
        in message
    )
    assert f"(kill {os.getpid()})" in message
    first.release()
    assert "ended" in json.loads(path.read_text())
    with RunLock.acquire(path, said.append):  # a clean release leaves nothing to take over
        pass
    assert said == []


def test_stage_of_a_crashed_runner_holds_the_lock_then_the_next_run_takes_over(tmp_path):
    path = tmp_path / "pofe-run.lock"
    runner = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUNNER, str(path)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True
    )
    runner_pid, stage_pid = map(int, runner.stdout.readline().split())
    assert runner.wait() == 0
    try:
        with pytest.raises(RunLocked) as err:
            RunLock.acquire(path, print)
        message = str(err.value)
        assert (
            f"locked by a stage process of an `axolotl pofe run` that has ended (PID {runner_pid} on host {socket.gethostname()}"
            in message
        )
        assert f"fuser -v {path}" in message
    finally:
        runner.stdin.close()  # the stage's stdin (inherited): it now exits
    said = []
    deadline = time.monotonic() + 60
    while True:
        try:
            lock = RunLock.acquire(path, said.append)
            break
        except RunLocked:
            assert time.monotonic() < deadline, f"the lock was not freed after stage {stage_pid} was told to exit"
            time.sleep(0.05)
    lock.release()
    (line,) = said
    assert line.startswith(
        f"{path}: taking over from a run that ended without releasing it "
        f"(PID {runner_pid} on host {socket.gethostname()}, started "
    )


def test_unreadable_record_is_taken_over_with_a_word(tmp_path):
    path = tmp_path / "pofe-run.lock"
    path.write_text('{"pid": 12')  # cut short by a crash
    said = []
    RunLock.acquire(path, said.append).release()
    assert said == [f"{path}: taking over from a run that ended without releasing it (its record is unreadable)"]
