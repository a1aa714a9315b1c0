"""A stage never outlives the runner (`pofe.run.rounds.processes.run_logged` and its guard).

Fake stages are small Python processes; every wait polls for a state with a generous
deadline, so a slow machine only makes the tests slower.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pofe.run.rounds.processes import StageFailed, run_logged

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads process states from /proc")

# The runner: runs the stage given as argv[1] (with argv[2] its argument) through run_logged.
RUNNER = """
import sys
from pathlib import Path
from pofe.run.rounds.processes import run_logged
run_logged([sys.executable, "-c", sys.argv[1], sys.argv[2]], Path(sys.argv[3]), print, False)
"""
# A stage like `axolotl train` under accelerate: it starts the process doing the work, then
# both wait. Writes "<its pid> <the worker's pid>" to argv[1] (atomically), then sleeps.
STAGE = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {worker.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
if "--exit" not in sys.argv:
    time.sleep(600)
"""


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a reaped-late orphan is gone for us)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def stage_pids(pids_file: Path) -> list[int]:
    wait_for(pids_file.exists, "the stage started its worker")
    return [int(x) for x in pids_file.read_text().split()]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_killing_the_runner_ends_the_stage_and_its_worker(tmp_path, sig):
    pids_file = tmp_path / "pids"
    # SIGINT as a terminal sends it: a suite started in the background of a shell without job
    # control inherits SIGINT ignored, which a runner started from it would keep (and never end)
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, STAGE, str(pids_file), str(tmp_path / "stage.log")],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    pids = []
    try:
        pids = stage_pids(pids_file)
        assert all(running(p) for p in pids)
        runner.send_signal(sig)
        runner.wait(timeout=60)
        for pid in pids:
            wait_for(lambda pid=pid: not running(pid), f"PID {pid} ended after the runner got {sig.name}")
    finally:
        runner.kill()
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_what_a_finished_stage_leaves_running_is_ended(tmp_path):
    """The stage exits 0 with its worker still running: run_logged returns, worker gone."""
    pids_file = tmp_path / "pids"
    run_logged([sys.executable, "-c", STAGE, str(pids_file), "--exit"], tmp_path / "stage.log", print, False)
    stage, worker = stage_pids(pids_file)
    try:
        wait_for(lambda: not running(worker), "the finished stage's worker ended")
    finally:
        if running(worker):
            os.kill(worker, signal.SIGKILL)


def test_exit_status_output_and_kept_fds_pass_through(tmp_path):
    log = tmp_path / "stage.log"
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    holds = f"import os, sys; print('holds', os.fstat({lock}).st_ino == {os.fstat(lock).st_ino}); sys.exit(3)"
    with pytest.raises(StageFailed, match="exited with 3; last lines of") as err:
        run_logged([sys.executable, "-c", holds], log, print, False, keep_fds=(lock,))
    assert "holds True" in str(err.value) and log.read_text() == "holds True\n"
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    with pytest.raises(StageFailed, match=f"exited with {128 + signal.SIGKILL};"):
        run_logged([sys.executable, "-c", killed], log, print, False)
    os.close(lock)
