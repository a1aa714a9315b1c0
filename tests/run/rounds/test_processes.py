"""A stage never outlives the runner (`pofe.run.rounds.processes.run_logged` and its guard).

Fake stages are small Python processes; every wait polls for a state with a generous
deadline, so a slow machine only makes the tests slower.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pofe.run.rounds.processes import StageFailed, output_events, run_logged

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
    """A failed stage without a traceback: its status and its log's last lines, then the log's path."""
    log = tmp_path / "stage.log"
    lock = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    holds = f"import os, sys; print('holds', os.fstat({lock}).st_ino == {os.fstat(lock).st_ino}); sys.exit(3)"
    cmd = [sys.executable, "-c", holds]
    with pytest.raises(StageFailed) as err:
        run_logged(cmd, log, print, False, keep_fds=(lock,))
    header = f"$ {' '.join(cmd)}"
    assert str(err.value) == (
        f"{' '.join(cmd)} exited with 3:\nholds True\n(the stage's whole output, traceback included: {log})"
    )
    assert log.read_text() == f"{header}\nholds True\n"
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    with pytest.raises(StageFailed, match=f"exited with {128 + signal.SIGKILL}:"):
        run_logged([sys.executable, "-c", killed], log, print, False)
    os.close(lock)


class OneByteAtATime(io.RawIOBase):
    """A pipe that delivers one byte per read: every separator lands at a chunk's edge once."""

    def __init__(self, data: bytes):
        self.data = data

    def read1(self, size: int = -1) -> bytes:
        out, self.data = self.data[:1], self.data[1:]
        return out


# a stage's output as a terminal would get it: a line, a tqdm bar redrawn after "\r" and closed
# with "\n", a Windows line, and a last line without its newline (UTF-8 "é" split in two bytes)
BAR_OUTPUT = "start\n\r  0%|  | 0/2\r 50%|# | 1/2\r100%|##| 2/2\nend\r\nlast é".encode()


def test_output_events_tell_lines_from_a_redrawn_bar():
    """Lines (ended by \n, \r\n or the end) are lines; each state a \r ends is progress; the
    bar's last state, which \n ends, is a line."""
    events = list(output_events(io.BytesIO(BAR_OUTPUT)))
    assert events == [
        ("start", True),
        ("  0%|  | 0/2", False),
        (" 50%|# | 1/2", False),
        ("100%|##| 2/2", True),
        ("end", True),
        ("last é", True),
    ]


def test_output_events_show_a_bar_as_it_arrives():
    """Read byte by byte (every separator at a chunk's edge, "é" split): the same lines; a bar's
    state is shown as it grows, each a prefix of a state, and never becomes a line."""
    events = list(output_events(OneByteAtATime(BAR_OUTPUT)))
    assert [text for text, is_line in events if is_line] == ["start", "100%|##| 2/2", "end", "last é"]
    states = ("  0%|  | 0/2", " 50%|# | 1/2", "100%|##| 2/2")
    progress = [text for text, is_line in events if not is_line]
    assert set(states) <= set(progress) <= {state[:n] for state in states for n in range(1, 13)}


def test_a_progress_bar_goes_to_the_status_line_and_its_last_state_to_the_log(tmp_path):
    """The stage's bar: every state but the last to `progress` (then "" when the stage ends),
    the last to the log with the other lines, under the command line; nothing to `echo`
    unless streamed."""
    log, said, shown = tmp_path / "stage.log", [], []
    cmd = [sys.executable, "-c", f"import sys; sys.stdout.buffer.write({BAR_OUTPUT!r})"]
    run_logged(cmd, log, said.append, False, progress=shown.append)
    assert log.read_text() == f"$ {' '.join(cmd)}\nstart\n100%|##| 2/2\nend\nlast é\n"
    assert said == [] and shown[-1] == "" and "50%|# | 1/2" in shown
    run_logged(cmd, log, said.append, True)
    assert said == [f"$ {' '.join(cmd)}", "start", "100%|##| 2/2", "end", "last é"]
    # streamed to a terminal: the status line is cleared before a line is printed where it was
    both = []
    run_logged(
        cmd, log, lambda line: both.append(("line", line)), True, progress=lambda bar: both.append(("bar", bar))
    )
    assert both == [
        ("line", f"$ {' '.join(cmd)}"),
        ("line", "start"),
        ("bar", "0%|  | 0/2"),
        ("bar", "50%|# | 1/2"),
        ("bar", ""),
        ("line", "100%|##| 2/2"),
        ("line", "end"),
        ("line", "last é"),
        ("bar", ""),
    ]


# a warning of POFE's and one of a library's, as axolotl's log format writes them
POFE_WARNING = (
    "[2026-12-03 20:10:47,711] [WARNING] [axolotl.integrations.pofe.data.loader] "
    "POFE: 3 of 48 rows truncated to sequence_len 64"
)
LIBRARY_WARNING = "[2026-12-03 20:10:47,711] [WARNING] [torchao] Failed to load _C_mxfp8.so"


def test_pofe_warnings_reach_the_console_and_library_warnings_stay_in_the_log(tmp_path):
    """Not streamed: of the stage's lines, the console gets POFE's warning (its message) only."""
    log, said = tmp_path / "preprocess.log", []
    cmd = [sys.executable, "-c", f"print({LIBRARY_WARNING!r}); print({POFE_WARNING!r}); print('[INFO] done')"]
    run_logged(cmd, log, said.append, False)
    assert said == ["  warning: POFE: 3 of 48 rows truncated to sequence_len 64"]
    assert log.read_text().splitlines()[1:] == [LIBRARY_WARNING, POFE_WARNING, "[INFO] done"]


def test_a_pofe_error_in_the_stage_is_the_whole_message(tmp_path):
    """A stage (as axolotl's CLI runs the plugin: `show_pofe_errors` in `register`) raises a
    PofeError: StageFailed says that message and where the traceback is, nothing else; the
    log keeps the traceback."""
    log = tmp_path / "preprocess.log"
    stage = (
        "from pofe.errors import PofeError, show_pofe_errors\n"
        "show_pofe_errors()\n"
        "raise PofeError(\"dataset d.jsonl, row 2, field 'rewards': expected a number. Fix or remove this row.\")"
    )
    with pytest.raises(StageFailed) as err:
        run_logged([sys.executable, "-c", stage], log, print, False)
    assert str(err.value) == (
        "dataset d.jsonl, row 2, field 'rewards': expected a number. Fix or remove this row.\n"
        f"(the stage's whole output, traceback included: {log})"
    )
    assert "Traceback (most recent call last):" in log.read_text()


def test_another_error_is_the_first_tracebacks_exception(tmp_path):
    """Not a PofeError, under a launcher that adds its own traceback (as `accelerate launch`
    does): the message is the stage's exception, from the first traceback, not the launcher's."""
    log = tmp_path / "train.log"
    launcher = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'def f():\\n    raise RuntimeError(\"boom: out of memory\")\\nf()'], "
        "check=True)"
    )
    cmd = [sys.executable, "-c", launcher]
    with pytest.raises(StageFailed) as err:
        run_logged(cmd, log, print, False)
    assert str(err.value) == (
        f"{' '.join(cmd)} exited with 1:\nRuntimeError: boom: out of memory\n"
        f"(the stage's whole output, traceback included: {log})"
    )
    assert log.read_text().count("Traceback (most recent call last):") == 2


def test_output_to_takes_this_process_s_output_and_gives_it_back(tmp_path):
    """In the block, Python's prints, a logging handler made before it (as axolotl's are, on
    the process's stderr) and bytes written to fd 2 (as C libraries write) all go to the file;
    after it, the console has its output again, and the POFE warning the block logged."""
    log = tmp_path / "pofe-run.log"
    script = f"""
import logging, os, sys
from pathlib import Path
from pofe.run.rounds.processes import output_to
logger = logging.getLogger("library")
logger.addHandler(logging.StreamHandler(sys.stderr))
with output_to(Path({str(log)!r}), print):
    print("config dump")
    logger.warning("a library's warning")
    os.write(2, b"from C\\n")
    print({POFE_WARNING!r})
print("after")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert log.read_text() == f"config dump\na library's warning\nfrom C\n{POFE_WARNING}\n"
    assert (out.stdout, out.stderr) == ("warning: POFE: 3 of 48 rows truncated to sequence_len 64\nafter\n", "")
