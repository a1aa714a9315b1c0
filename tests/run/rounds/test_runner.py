"""The run's stage runner (`pofe.run.rounds.runner.StageRunner`): each named stage once, its start
and finish in `pofe-run.json`, exactly.

The state file's clock is replaced by one that ticks a second per reading, so every record
is known to the digit: `RunState.open` reads 100.0 (the run's start), a stage's start 101.0
and its finish 102.0 (1.0 s).
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

from pofe.run import folder as folder_module
from pofe.run.folder import RunState
from pofe.run.rounds.processes import StageFailed
from pofe.run.rounds.runner import StageRunner, duration


@pytest.fixture
def state(tmp_path, monkeypatch) -> RunState:
    ticks = iter(range(100, 200))
    monkeypatch.setattr(folder_module, "time", SimpleNamespace(time=lambda: float(next(ticks))))
    return RunState.open(tmp_path / "pofe-run.json", fingerprint="f", recipe="r.yml", method="rrhf")


def on_disk(state: RunState) -> dict:
    return json.loads(state.path.read_text())


def expected(stages: dict) -> dict:
    """The whole state file of a run started at 100.0 holding `stages`."""
    return {
        "version": 2,
        "recipe": "r.yml",
        "recipe_fingerprint": "f",
        "method": "rrhf",
        "stages": stages,
        "rounds": {},
        "starts": [100.0],
        # what the prompts stage and the round loop set: unset in a runner's own test
        **dict.fromkeys(
            ("prompt_mode", "rounds_planned", "prompt_sources", "base_model", "pi_0", "stopped", "final_policy")
        ),
        "overrides": None,  # axolotl's command-line options, set by the round loop
        "kind": "rounds",
    }


def test_a_stage_runs_once_and_records_what_it_returns(state):
    """Start (with its `started` facts) at 101, finish at 102 with the facts `work` returns;
    run again, the finished stage is skipped: nothing said, nothing run, the record as it was."""
    said, calls = [], []

    def work():
        calls.append(on_disk(state)["stages"]["round-1/train"])  # what a kill here would leave
        return {"output_dir": "/o"}

    runner = StageRunner(state, echo=said.append)
    runner.run("round-1/train", work, says="round 1/2: train", started={"resumed_from": None})
    runner.run("round-1/train", work, says="round 1/2: train", started={"resumed_from": None})

    assert calls == [{"status": "running", "started": 101.0, "resumed_from": None}]
    assert said == ["round 1/2: train", "  done in 1 s"]
    assert on_disk(state) == expected(
        {
            "round-1/train": {
                "status": "done",
                "started": 101.0,
                "finished": 102.0,
                "seconds": 1.0,
                "resumed_from": None,
                "output_dir": "/o",
            }
        }
    )


def test_a_stage_says_what_it_made_how_long_it_took_and_where_its_log_is(state, tmp_path):
    """Two lines per stage on the console: `says` as it starts; as it ends, its time (1 s on
    the test's clock), `made` of the facts its work returned, and the log of its command (in
    the run's folder, where the state file is). The command's own output goes to the log only."""
    said = []
    runner = StageRunner(state, echo=said.append, stream=False)
    log = tmp_path / "round-1" / "train.log"

    def work():
        runner.command([sys.executable, "-c", "print('1000 lines of axolotl')"], log)
        return {"steps": 24}

    runner.run("round-1/train", work, says="round 1/2: train", made=lambda facts: f"{facts['steps']} steps")
    assert said == ["round 1/2: train", "  done in 1 s: 24 steps; log round-1/train.log"]
    assert log.read_text().splitlines()[1:] == ["1000 lines of axolotl"]


@pytest.mark.parametrize("seconds, shown", [(0.4, "0 s"), (41.4, "41 s"), (185, "3 min 05 s"), (7440, "2 h 04 min")])
def test_durations(seconds, shown):
    assert duration(seconds) == shown


def test_a_stage_without_facts_or_words(state):
    """`work` returning None records the bare finish; no `says`, no echo."""
    said = []
    StageRunner(state, echo=said.append).run("prompts", lambda: None)
    assert said == []
    assert on_disk(state)["stages"] == {
        "prompts": {"status": "done", "started": 101.0, "finished": 102.0, "seconds": 1.0}
    }


def test_a_stage_runs_again_when_its_inputs_changed(state):
    """The eval stage's rule: done AND the same models. Recorded with models [pi_0, pi_1];
    asked again with those, skipped; with a second round's model, run again (start 103,
    finish 104) and recorded with the new models."""
    runs = []
    runner = StageRunner(state, echo=lambda _: None)
    one = [["pi_0", "/b"], ["pi_1", "/r1"]]
    two = [*one, ["pi_2", "/r2"]]
    for models in (one, one, two):
        runner.run("eval", lambda: runs.append(1), says="evaluate", inputs={"models": models})
    assert len(runs) == 2
    assert on_disk(state)["stages"] == {
        "eval": {"status": "done", "started": 103.0, "finished": 104.0, "seconds": 1.0, "models": two}
    }


def test_a_failing_command_leaves_its_stage_started_and_names_its_log(state, tmp_path):
    """The stage's process exits 3: StageFailed names the stage, what the stage said and its
    log (which holds the command and its output); the stage stays recorded as started and not
    finished (a restart redoes it); the runner said only that the stage started."""
    said = []
    runner = StageRunner(state, echo=said.append, stream=False)
    log = tmp_path / "round-1" / "preprocess.log"
    cmd = [sys.executable, "-c", "print('half done'); raise SystemExit(3)"]
    with pytest.raises(StageFailed) as err:
        runner.run("round-1/preprocess", lambda: runner.command(cmd, log), says="round 1/1: generate")

    assert str(err.value) == (
        f"round-1/preprocess failed: {' '.join(cmd)} exited with 3:\nhalf done\n"
        f"(the stage's whole output, traceback included: {log})"
    )
    assert log.read_text() == f"$ {' '.join(cmd)}\nhalf done\n"
    assert said == ["round 1/1: generate"]
    assert on_disk(state) == expected({"round-1/preprocess": {"status": "running", "started": 101.0}})
    assert not StageRunner(state).done("round-1/preprocess")


def test_a_command_holds_the_runners_fds_and_gets_its_env(state, tmp_path):
    """`command` runs the stage under the guard with the runner's `keep_fds` open in it, the
    first named as the run's lock (POFE_RUN_LOCK_FD), and `env` added to its environment."""
    read_end, write_end = os.pipe()
    try:
        runner = StageRunner(state, echo=lambda _: None, stream=False, keep_fds=(write_end,))
        script = (
            f"import os; os.write({write_end}, b'held'); "
            "print(os.environ['POFE_TEST_STAGE'], os.environ['POFE_RUN_LOCK_FD'])"
        )
        log = tmp_path / "stage.log"
        runner.run("s", lambda: runner.command([sys.executable, "-c", script], log, env={"POFE_TEST_STAGE": "x"}))
        assert os.read(read_end, 4) == b"held"
        assert log.read_text().splitlines()[1:] == [f"x {write_end}"]
    finally:
        os.close(read_end)
        os.close(write_end)
    assert on_disk(state)["stages"]["s"]["status"] == "done"


def test_work_in_this_process_goes_to_its_log_and_a_failure_names_it(state, tmp_path):
    """`in_process`: what the stage's own process prints (file descriptors 1 and 2: Python's
    streams write there outside pytest's capture, C libraries always) goes to the log its end line names; an exception leaves its traceback there and ends the stage with
    StageFailed, POFE's message as it is, any other as `Kind: message`, and the log's path."""
    said = []
    runner = StageRunner(state, echo=said.append, stream=False)
    log = tmp_path / "logs" / "prepare.log"

    def work():
        with runner.in_process(log):
            os.write(1, b"a library's warning\n")
            os.write(2, b"a C library's line\n")

    runner.run("prepare", work, says="prepare")
    assert said == ["prepare", "  done in 1 s; log logs/prepare.log"]
    assert log.read_text().splitlines() == ["a library's warning", "a C library's line"]

    from pofe.errors import PofeError

    for error, shown in ((PofeError("row 2: fix it"), "row 2: fix it"), (KeyError("x"), "KeyError: 'x'")):

        def failing(error=error):
            with runner.in_process(tmp_path / "logs" / "evaluate.log"):
                raise error

        with pytest.raises(StageFailed) as failed:
            runner.run("evaluate", failing, says="evaluate")
        log_path = tmp_path / "logs" / "evaluate.log"
        assert (
            str(failed.value)
            == f"evaluate failed: {shown}\n(the stage's whole output, traceback included: {log_path})"
        )
        assert "Traceback (most recent call last):" in log_path.read_text()
        assert on_disk(state)["stages"]["evaluate"]["status"] == "running"
