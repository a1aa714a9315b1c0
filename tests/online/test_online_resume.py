"""A killed online run (issue 45): resumed only on refreshes its recipe makes, one training per
output_dir, and its folder evaluated as what it is.

The tests share one run of the online RRHF toy, trained once: 6 steps of 5 prompts, a refresh
every 2 steps (at 0, 2, 4), checkpoints at steps 3 and 6, judged by a python judge that
abstains on about a quarter of the responses (`tests.online.judges`). Each test copies it and
kills it where it needs to."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from pofe.demo.tiny import build_tiny_model
from pofe.files import read_jsonl, weights_fingerprint
from pofe.locks import TRAIN_LOCK, FolderLock
from tests.helpers import TESTS_ON_PATH as JUDGES_ENV
from tests.helpers import log_history, run_axolotl
from tests.online.test_online_e2e import _refreshes, _toy

pytestmark = pytest.mark.e2e

JUDGE = "tests.online.judges:abstains_on_a_quarter"
RECIPE = "tiny-rrhf-online-cpu.yml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """The 6-step run, finished: its folder and its console."""
    root = tmp_path_factory.mktemp("six-steps")
    changes = dict(
        micro_batch_size=5,
        num_epochs=1,
        max_steps=6,
        logging_steps=1,
        save_strategy="steps",
        save_steps=3,
        pofe={
            "online": {"refresh_every": 2},
            "judge": {"type": "python", "function": JUDGE},
            "eval": {"held_out": 4, "num_samples": 1, "max_new_tokens": 4},
        },
    )
    path, _, _ = _toy(root, RECIPE, **changes)
    proc = run_axolotl("train", str(path), cwd=root, env=JUDGES_ENV)
    return root, proc.stdout + proc.stderr


@pytest.fixture
def killed(trained, tmp_path) -> tuple[Path, Path]:
    """A copy of the run killed after refresh 4 was written (checkpoint-6 removed): its recipe and
    its output_dir."""
    root, _ = trained
    shutil.copytree(root, tmp_path / "run")
    path = tmp_path / "run" / RECIPE
    path.write_text(path.read_text().replace(str(root), str(tmp_path / "run")))
    out = Path(yaml.safe_load(path.read_text())["output_dir"])
    shutil.rmtree(out / "checkpoint-6")
    return path, out


def _resumed(path: Path, name: str, **pofe) -> Path:
    """`path`'s recipe resumed from checkpoint-3, with `pofe` merged into its block."""
    recipe = yaml.safe_load(path.read_text())
    recipe["resume_from_checkpoint"] = str(Path(recipe["output_dir"]) / "checkpoint-3")
    recipe["pofe"] = {**recipe["pofe"], **pofe}
    out = path.parent / name
    out.write_text(yaml.safe_dump(recipe))
    return out


def _said(proc) -> str:
    return proc.stdout + proc.stderr


def _folders(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "online").glob("refresh-*"))  # beside them: monitor.jsonl


def test_each_refresh_counts_its_judges_abstentions(trained):
    """The judge abstained on about a quarter of the responses: each refresh's stats count its
        verdicts and abstentions as its judge.jsonl records them, the log has them as online/*, and
        the console line says them. The training held its output_dir's lock, released it and removed
    its file."""
    root, said = trained
    out = root / "outputs" / "tiny-rrhf-online-cpu"
    logged = {e["step"]: e for e in log_history(out) if "online/refresh" in e}
    for window, _, stats in _refreshes(out):
        judged = read_jsonl(out / "online" / f"refresh-{window.start_step:07d}" / "judge.jsonl")
        verdicts, abstained = sum(r.get("judged", 0) for r in judged), sum(r["abstained"] for r in judged)
        assert 0 < abstained < verdicts / 2
        assert (stats["judge_verdicts"], stats["judge_abstentions"]) == (verdicts, abstained)
        assert logged[window.start_step]["online/judge_abstentions"] == abstained
        assert f"at step {window.start_step}: " in said
        assert f", judge abstained on {abstained} of {verdicts} verdicts;" in said
    assert not (out / TRAIN_LOCK).exists()  # released, and removed: no lock file in the model's folder


def test_a_resumed_run_trains_only_on_refreshes_its_recipe_makes(killed):
    """Resumed from checkpoint-3: step 3 falls in refresh 2 (steps 2-3).

    - With another judge: refresh 2's rows carry the first judge's labels, so it stops before any
      step, naming the judge both ways, and deletes nothing.
    - With refresh 2 deleted, as that message says: a new window at step 3 with the new judge,
      said on the console; refresh 4 (the killed run's, steps 4-5, which step 5 would have read
      back as its own: the same prompts) is removed, said too. Refreshes at 0, 3, 5, the last
      two by the new judge."""
    path, out = killed
    other = _resumed(path, "other-judge.yml", judge={"type": "python", "function": "tests.online.judges:halved"})
    proc = run_axolotl("train", str(other), cwd=out.parent, env=JUDGES_ENV, check=False)
    said = _said(proc)
    assert proc.returncode != 0
    assert f"resuming at step 3: the refresh of step 2 ({out / 'online' / 'refresh-0000002'})" in said
    assert f'judge.function: "{JUDGE}" then, "tests.online.judges:halved" now' in said
    assert _folders(out) == ["refresh-0000000", "refresh-0000002", "refresh-0000004"]

    shutil.rmtree(out / "online" / "refresh-0000002")
    said = _said(run_axolotl("train", str(other), cwd=out.parent, env=JUDGES_ENV))
    assert "online: resuming at step 3, which no finished refresh holds (refreshes start at steps [0, 4])" in said
    assert "online: removing the 1 refreshes the killed run wrote after step 3 (steps [4])" in said
    starts = [w.start_step for w, _, _ in _refreshes(out)]
    assert starts == [0, 3, 5]
    made = [json.loads((out / "online" / f"refresh-{s:07d}" / "refresh.json").read_text()) for s in starts]
    assert [m["made_with"]["judge"]["function"] for m in made] == [JUDGE] + ["tests.online.judges:halved"] * 2


def test_a_run_resumed_after_its_base_models_weights_changed_is_refused(tmp_path):
    """With kl_coef, a refresh's rows hold pi_0's log-probs (pi_0_logps), pi_0 being base_model. A
    2-step run (one refresh, at 0; checkpoint at step 1) whose base_model folder is then rewritten
    in place with other weights (another seed): resumed at step 1, which trains on refresh 0, it
    stops before any step, naming base_model's weights then and now, and deletes nothing."""
    changes = dict(
        micro_batch_size=5,
        num_epochs=1,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        pofe={"online": {"refresh_every": 2, "kl_coef": 0.01}},
    )
    path, recipe, _ = _toy(tmp_path, RECIPE, **changes)
    run_axolotl("train", str(path), cwd=tmp_path)
    out, base = Path(recipe["output_dir"]), recipe["base_model"]
    then = json.loads((out / "online" / "refresh-0000000" / "refresh.json").read_text())["made_with"]
    assert then["pi_0_weights"] == weights_fingerprint(base)

    build_tiny_model(base, seed=1)
    now = weights_fingerprint(base)
    assert now != then["pi_0_weights"]
    recipe["resume_from_checkpoint"] = str(out / "checkpoint-1")
    path.write_text(yaml.safe_dump(recipe))
    proc = run_axolotl("train", str(path), cwd=tmp_path, check=False)
    said = _said(proc)
    assert proc.returncode != 0
    assert (
        f"resuming at step 1: the refresh of step 0 ({out / 'online' / 'refresh-0000000'}), whose rows steps 0-1 "
        "train on, was made otherwise than this recipe makes them: the weights of base_model (pi_0, whose "
        f"log-probs its rows hold): {then['pi_0_weights'][:12]} then, {now[:12]} now. Resume with the recipe" in said
    )
    assert _folders(out) == ["refresh-0000000"]


def test_a_run_resumed_with_another_refresh_every_says_whose_windows_it_trains_on(killed):
    """refresh_every 3 where the killed run refreshed every 2, and the killed run's refresh 4 cut
    short as it was written (no refresh.json, a rows.jsonl.tmp-<pid> left): step 3 trains on
    refresh 2, said on the console; step 4 samples a new window, for refresh_every 3, in a
    folder cleared of the cut one's files."""
    path, out = killed
    cut = out / "online" / "refresh-0000004"
    (cut / "refresh.json").unlink()
    (cut / "rows.jsonl").rename(cut / "rows.jsonl.tmp-999")
    every_3 = _resumed(path, "every-3.yml", online={"refresh_every": 3})
    said = _said(run_axolotl("train", str(every_3), cwd=out.parent, env=JUDGES_ENV))
    assert (
        "online: the refresh of step 2 was sampled for refresh_every 2; this recipe's is 3: step 3 trains on its "
        "rows (steps 2-3), and the refreshes after it come every 3 steps. Resume with refresh_every: 2 to keep the "
        "killed run's schedule" in said
    )
    assert [w.start_step for w, _, _ in _refreshes(out)] == [0, 2, 4]
    assert sorted(p.name for p in cut.iterdir()) == ["generate.jsonl", "judge.jsonl", "refresh.json", "rows.jsonl"]
    assert json.loads((cut / "refresh.json").read_text())["refresh_every"] == 3


def test_a_run_resumed_at_a_window_boundary_with_another_refresh_every_says_so(trained, tmp_path):
    """The finished run resumed from its last checkpoint (step 6, where refresh 4's window, steps
    4-5, ended) for 2 more steps with refresh_every 3: no written window holds step 6, so it samples
    one, and says that the killed run's refreshes came every 2 (it said nothing of the change)."""
    root, _ = trained
    shutil.copytree(root, tmp_path / "run")
    path = tmp_path / "run" / RECIPE
    path.write_text(path.read_text().replace(str(root), str(tmp_path / "run")))
    recipe = yaml.safe_load(path.read_text())
    out = Path(recipe["output_dir"])
    recipe.update(max_steps=8, resume_from_checkpoint=str(out / "checkpoint-6"))
    recipe["pofe"]["online"]["refresh_every"] = 3
    path.write_text(yaml.safe_dump(recipe))
    said = _said(run_axolotl("train", str(path), cwd=out.parent, env=JUDGES_ENV))
    assert (
        "online: the refresh of step 4 was sampled for refresh_every 2; this recipe's is 3: step 6 samples a new "
        "window, and the refreshes after it come every 3 steps. Resume with refresh_every: 2 to keep the killed "
        "run's schedule" in said
    )
    assert [w.start_step for w, _, _ in _refreshes(out)] == [0, 2, 4, 6]


def test_a_resumed_run_whose_refresh_lost_its_rows_is_refused_naming_the_file(killed):
    """Refresh 2 (steps 2-3, which the resumed step 3 trains on) with its refresh.json but its
    rows.jsonl deleted: the resumed run stops before any step, naming the missing file and what to
    do (it stopped with a FileNotFoundError traceback), and deletes nothing."""
    path, out = killed
    folder = out / "online" / "refresh-0000002"
    (folder / "rows.jsonl").unlink()
    proc = run_axolotl("train", str(_resumed(path, "resumed.yml")), cwd=out.parent, env=JUDGES_ENV, check=False)
    said = _said(proc)
    assert proc.returncode != 0 and "Traceback" not in said
    assert (
        f"Error: resuming at step 3: the refresh of step 2 ({folder}), whose rows step 3 trains on, has its "
        f"refresh.json but no rows.jsonl ({folder / 'rows.jsonl'} is missing). Restore the file; or delete {folder}: "
        "the run then samples and judges a new window at step 3" in said
    )
    assert _folders(out) == ["refresh-0000000", "refresh-0000002", "refresh-0000004"]


def test_a_second_training_in_an_output_dir_in_use_is_refused_before_it_deletes(killed):
    """While a training holds the output_dir (its lock, taken here as `axolotl train` takes it),
    the recipe trained afresh there, which would replace the refreshes as an earlier run's, is
    refused naming the holder, and nothing in the folder is deleted or written."""
    path, out = killed
    with FolderLock.acquire(out / TRAIN_LOCK, print, "axolotl train", RuntimeError):
        before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))  # the lock's file among them
        proc = run_axolotl("train", str(path), cwd=out.parent, env=JUDGES_ENV, check=False)
        after = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    said = _said(proc)
    assert proc.returncode != 0
    assert f"output_dir {out} is in use by another `axolotl train` (PID {os.getpid()} on host" in said
    assert f"Wait for it to finish or stop it (kill {os.getpid()}), or give this training an output_dir" in said
    assert "replacing" not in said
    assert after == before


def test_a_killed_runs_folder_is_evaluated_at_its_checkpoint_and_reported_as_such(killed):
    """Killed before its end (refresh 4 cut short as it was written: no refresh.json), the output_dir
    holds config.json (axolotl writes it as training starts) and no weights: `axolotl pofe eval`
    says so without a traceback, with what the folder holds (the newest whole checkpoint,
    checkpoint-3, step 3 of 6; the refreshes whole and cut short) and what to do (evaluate the
    checkpoint, or resume the training from it), before it writes anything (it failed in
    transformers, leaving a state `pofe report` read as a trained pi_1; then it named the
    checkpoint only). Evaluated, checkpoint-3's report says it was trained 3 of 6 steps, and
    tables the refreshes its steps trained on (0 and 2)."""
    from pofe.run.evaluation.evaluate import evaluate_run
    from pofe.run.report import write_report

    path, out = killed
    (out / "model.safetensors").unlink()
    (out / "online" / "refresh-0000004" / "refresh.json").unlink()
    proc = run_axolotl("pofe", "eval", str(path), cwd=out.parent, env=JUDGES_ENV, check=False)
    said = _said(proc)
    assert proc.returncode == 1 and "Traceback" not in said
    checkpoint = out / "checkpoint-3"
    assert (
        f"Error: {out} holds no weights (none of model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
        "pytorch_model.bin.index.json, adapter_model.safetensors, adapter_model.bin) (axolotl writes config.json "
        "when a training starts and the weights when it ends: this training did not end): it cannot be "
        f"evaluated. Its newest whole checkpoint is {checkpoint} (step 3 of 6). Its online training wrote 2 whole "
        "refreshes (the last at step 2), and 1 cut short (at steps [4]). Either evaluate it with --model "
        f"{checkpoint}, or finish the training first: set resume_from_checkpoint: {checkpoint} in {path} and run "
        f"`axolotl train {path}` again.\n"
    ) in said
    assert not (out / "pofe-eval").exists()

    folder = evaluate_run(path, model=str(out / "checkpoint-3"))
    write_report(folder)
    report = (folder.root / "report.md").read_text()
    assert "**pi_1 was trained 3 of 6 steps**: its training had not ended" in report
    assert "2 refreshes, every 2 optimizer steps" in report
