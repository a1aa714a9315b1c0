"""What a run checks before it writes or trusts its folder (`pofe.run.guards`): one runner per
output_dir (pofe-run.lock), an output_dir of other files refused or recorded, a replaced
prompt file named at the next start."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pofe.args import PofeConfig
from pofe.run.folder import RunFolder, RunState, RunStateMismatch
from pofe.run.guards import PREEXISTING_NAME, OutputDirRefused, RunLock, RunLocked, claim_output_dir, pofe_wrote
from pofe.run.report import write_report
from tests.helpers import ROOT

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


def _foreign(root: Path) -> dict[str, str]:
    files = {
        "eval/eval.json": '{"mine": 1}',
        "report.md": "my notes",
        "report-old.png": "png",
        "prompts/round-1.jsonl": "{}",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return files


def test_a_folder_of_other_files_is_refused_and_left_as_it_was(tmp_path):
    files = _foreign(tmp_path)
    with pytest.raises(
        OutputDirRefused,
        match=r"holds 4 files but no POFE run \(eval, prompts, report-old.png, "
        r"report.md\).*pofe.overwrite_output_dir: true",
    ):
        claim_output_dir(RunFolder(tmp_path), overwrite=False, echo=print)
    assert {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == files


def test_a_file_as_output_dir_is_named(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(OutputDirRefused, match=rf"output_dir {tmp_path / 'out'} is a file, not a folder"):
        claim_output_dir(RunFolder(tmp_path / "out"), overwrite=False, echo=print)


@pytest.mark.parametrize("marker", ["pofe-run.json", "pofe-run.lock", "debug.log", None])
def test_a_new_folder_or_a_pofe_run_is_taken_as_it_is(tmp_path, marker):
    """A missing folder, one holding only axolotl's debug.log (which every load of a recipe
    writes there), or a run's (its state; or its lock alone: a run killed before its state
    was written) needs no key and records nothing."""
    root = tmp_path / "run"
    if marker == "debug.log":
        root.mkdir()
        (root / marker).write_text("log")
    elif marker:
        _foreign(root)
        (root / marker).write_text("{}")
    claim_output_dir(RunFolder(root), overwrite=False, echo=print)
    assert not (root / PREEXISTING_NAME).exists()


def test_the_logs_of_a_recipe_that_failed_to_load_leave_the_folder_new(tmp_path):
    """A recipe refused while it loads leaves axolotl's debug.log and the runner's pofe-run.log,
    but no state: the next start takes the folder as new, not as someone else's files."""
    (tmp_path / "debug.log").write_text("log")
    RunFolder(tmp_path).runner_log.write_text("config dump")
    claim_output_dir(RunFolder(tmp_path), overwrite=False, echo=print)
    assert not (tmp_path / PREEXISTING_NAME).exists()


def test_overwrite_records_what_was_there_and_the_report_keeps_it(tmp_path):
    """With the key, the files found are recorded; the report's clean-up of old plots then
    removes POFE's own (report-rewards.png, written after the start) and keeps the one that
    was there (report-old.png). Without the record both went."""
    _foreign(tmp_path)
    said = []
    folder = RunFolder(tmp_path)
    claim_output_dir(folder, overwrite=True, echo=said.append)
    assert "holds 4 files of no POFE run" in said[0]
    recorded = json.loads((tmp_path / PREEXISTING_NAME).read_text())["files"]
    assert sorted(recorded) == ["eval/eval.json", "prompts/round-1.jsonl", "report-old.png", "report.md"]
    assert recorded["report.md"] == [len("my notes"), (tmp_path / "report.md").stat().st_mtime_ns]
    (tmp_path / "report-rewards.png").write_text("an earlier report's plot")
    assert not pofe_wrote(folder, tmp_path / "eval" / "eval.json") and pofe_wrote(
        folder, tmp_path / "report-rewards.png"
    )

    RunState(folder.state, "r.yml", "f", "sppo", starts=[1.0], rounds_planned=1).save()
    report = write_report(folder)
    assert (tmp_path / "report-old.png").read_text() == "png"
    assert not (tmp_path / "report-rewards.png").exists()
    assert report.data["eval"] is None  # the eval/eval.json found there is not read as the run's
    assert pofe_wrote(folder, tmp_path / "report.md")  # rewritten by the report: POFE's now
    claim_output_dir(folder, overwrite=False, echo=said.append)  # a run now: no key needed to resume


RECIPE = ROOT / "recipes" / "tiny-rrhf-cpu.yml"


def test_pofe_run_refuses_the_folder_before_writing_anything(tiny_model, tmp_path):
    """`axolotl pofe run`'s entry point, on the README's CPU recipe pointed at a tiny model:
    refused before its lock, state or prompts are written."""
    from pofe.run.rounds.loop import run_rounds

    out = tmp_path / "out"
    out.mkdir()
    files = _foreign(out)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "near_misses": []}) + "\n" for i in range(4))
    )
    raw = yaml.safe_load(RECIPE.read_text())
    raw.update(base_model=str(tiny_model), output_dir=str(out), dataset_prepared_path=str(tmp_path / "prepared"))
    raw["datasets"][0]["path"] = str(prompts)
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(yaml.safe_dump(raw))
    with pytest.raises(OutputDirRefused, match="no POFE run"):
        run_rounds(recipe, echo=print)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(files)


def test_a_replaced_prompt_file_is_named_at_the_next_start(tmp_path):
    """Weak case of issue 20: the prompts stage copies the prompt file once, so a file replaced
    between starts was silently ignored. Its sha256 is recorded at the first start."""
    from types import SimpleNamespace

    from pofe.run.guards import check_prompt_sources, prompt_sources

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"q": "a"}\n')
    cfg = SimpleNamespace(datasets=[SimpleNamespace(path=str(prompts))])
    pcfg = PofeConfig(method="rrhf")
    state = RunState.open(tmp_path / "pofe-run.json", fingerprint="a", recipe="r.yml", method="rrhf")
    check_prompt_sources(prompt_sources(cfg, pcfg), state)
    assert list(state.prompt_sources) == [str(prompts)]
    check_prompt_sources(prompt_sources(cfg, pcfg), RunState.read(state.path))  # unchanged: fine
    prompts.write_text('{"q": "b"}\n')
    with pytest.raises(RunStateMismatch, match=rf"the prompt file {re.escape(str(prompts))} changed since"):
        check_prompt_sources(prompt_sources(cfg, pcfg), RunState.read(state.path))
    # round_prompts as sets: a local file, and a dataset spec naming a local file
    second = tmp_path / "r2.jsonl"
    second.write_text('{"q": "c"}\n')
    sets = PofeConfig(method="rrhf", rounds=2, round_prompts=[str(prompts), {"path": str(second)}])
    assert list(prompt_sources(cfg, sets)) == [str(prompts), str(second)]
