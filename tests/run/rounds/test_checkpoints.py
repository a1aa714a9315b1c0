"""Which checkpoint a round resumes from (`pofe.run.rounds.checkpoints`): its own recipe's, whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pofe.run.folder import RunFolder, RunState, RunStateMismatch
from pofe.run.rounds.round_recipe import round_recipe
from tests.helpers import ITERATED_RAW


def test_killed_training_resumes_from_its_last_complete_checkpoint(tmp_path, monkeypatch):
    """Round 1's train stage was killed after saving checkpoints 2, 9 and 10 and while
    saving 12 (no trainer_state.json yet). The restart's recipe resumes from 10: the
    highest complete step (by number: "checkpoint-9" sorts after "checkpoint-10" as text)."""
    import yaml

    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner

    folder = RunFolder(tmp_path / "run")
    train = folder.train(1)
    # the killed start recorded what it trained with (its recipe had no resume_from_checkpoint)
    rounds.claim_training(folder, 1, round_recipe(ITERATED_RAW, folder, 1, "/m/base", seed=7).recipe, None)
    for step in (2, 9, 10, 12):
        (train / f"checkpoint-{step}").mkdir(parents=True)
        if step != 12:
            (train / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="sppo")
    state.start("round-1/preprocess")
    state.finish("round-1/preprocess")
    state.start("round-1/train")  # killed here

    ran = []

    def fake_stage(cmd, log, echo, stream, keep_fds=(), env=None, progress=None):
        recipe = yaml.safe_load(Path(cmd[2]).read_text())
        ran.append((cmd[1], recipe.get("resume_from_checkpoint"), keep_fds))
        final = train / "checkpoint-20"  # the forced save at the end (save_strategy: no)
        final.mkdir()
        (final / "trainer_state.json").write_text(json.dumps({"global_step": 20}))

    monkeypatch.setattr(runner, "run_logged", fake_stage)
    said = []
    plan = rounds.RoundPlan(t=1, rounds=1, policy="/m/base", adapter=False, seed=7)
    stages = runner.StageRunner(state, echo=said.append, stream=False, keep_fds=(5,))
    rounds.run_round(ITERATED_RAW, folder, plan, stages)
    resumed = str(train / "checkpoint-10")
    assert ran == [("train", resumed, (5,))]
    assert said[0] == f"round 1/1: train, resuming from {resumed}"
    assert said[1].endswith(": 20 steps, model round-1/train; log round-1/train.log") and len(said) == 2
    record = state.stages["round-1/train"]
    assert record["status"] == "done" and record["resumed_from"] == resumed
    assert json.loads(folder.trainer_state(1).read_text()) == {"global_step": 20}
    assert not list(train.glob("checkpoint-*"))  # the forced save's cleanup, after the stage

    # started again: nothing runs, and round-1/recipe.yml still says what ran
    rounds.run_round(ITERATED_RAW, folder, plan, stages)
    assert len(ran) == 1
    assert yaml.safe_load(folder.recipe(1).read_text())["resume_from_checkpoint"] == resumed


def test_training_without_checkpoints_starts_over(tmp_path):
    from pofe.run.rounds.loop import resume_point

    folder = RunFolder(tmp_path)
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="rrhf")
    state.start("round-1/train")
    (folder.train(1) / "checkpoint-3").mkdir(parents=True)  # cut short: no trainer_state.json
    assert resume_point(folder, state, 1) is None
    recipe, _ = round_recipe(ITERATED_RAW, folder, 1, "/m/base", seed=7, resume_from=None)
    assert "resume_from_checkpoint" not in recipe


def _killed_round_1(folder: RunFolder, raw: dict, steps=(6,)) -> RunState:
    """Round 1 trained from `raw` (recorded), saved checkpoint-<step> for each of `steps`, and was
    killed; its state file then went (`pofe-run.json` deleted): a new state, nothing done."""
    from pofe.run.rounds import loop as rounds

    rounds.claim_training(folder, 1, round_recipe(raw, folder, 1, "/m/base", seed=7).recipe, None)
    for step in steps:
        (folder.train(1) / f"checkpoint-{step}").mkdir(parents=True)
        (folder.train(1) / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    state = RunState.open(folder.state, fingerprint="b", recipe="r.yml", method="sppo")
    state.start("round-1/preprocess")
    state.finish("round-1/preprocess")
    return state


@pytest.mark.parametrize("change", ["learning_rate", "candidates", "no record"])
def test_another_recipes_checkpoint_is_not_resumed(tmp_path, monkeypatch, change):
    """Bad case 1 of issue 20: with pofe-run.json gone, a run with another learning rate (or
    other candidates, or checkpoints nobody recorded) resumed round 1 from the old run's
    checkpoint-6 and trained for 0 s. Now it stops before training, naming the checkpoint and
    what differs."""
    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner
    from pofe.run.rounds.checkpoints import RECORD_NAME

    folder = RunFolder(tmp_path / "run")
    (folder.candidates(1)).mkdir(parents=True)
    (folder.candidates(1) / "data.jsonl").write_text('{"prompt": "a"}\n')
    state = _killed_round_1(folder, ITERATED_RAW)
    raw = {**ITERATED_RAW, "learning_rate": 0.5} if change == "learning_rate" else ITERATED_RAW
    if change == "candidates":
        (folder.candidates(1) / "data.jsonl").write_text('{"prompt": "b"}\n')
    if change == "no record":
        (folder.train(1) / RECORD_NAME).unlink()
    ran = []
    monkeypatch.setattr(runner, "run_logged", lambda cmd, *a, **k: ran.append(cmd))
    plan = rounds.RoundPlan(t=1, rounds=1, policy="/m/base", adapter=False, seed=7)
    checkpoint = folder.train(1) / "checkpoint-6"
    says = {
        "learning_rate": r"differs in: learning_rate\)",
        "candidates": r"differs in: <candidates data.jsonl>\)",
        "no record": "is missing or unreadable",
    }[change]
    with pytest.raises(
        RunStateMismatch, match=rf"round 1 would resume from {re.escape(str(checkpoint))}.*{says}.*Delete "
    ):
        rounds.run_round(raw, folder, plan, runner.StageRunner(state, echo=lambda _: None, stream=False))
    assert ran == [] and not state.stages.get("round-1/train")


def test_the_same_recipe_resumes_past_a_damaged_checkpoint(tmp_path):
    """checkpoints 4 and 6 are complete by the trainer's mark (trainer_state.json), but 6's
    weights are cut short (its safetensors header promises more bytes than the file has):
    round 1 resumes from 4, saying which file of 6 is damaged. Then 6's optimizer.pt (a torch
    zip) is cut short instead: the same."""
    import torch
    from safetensors.torch import save_file

    from pofe.run.rounds.loop import resume_point

    folder = RunFolder(tmp_path / "run")
    state = _killed_round_1(folder, ITERATED_RAW, steps=(4, 6))
    damaged = folder.train(1) / "checkpoint-6"
    for checkpoint in ("checkpoint-4", "checkpoint-6"):
        save_file({"w": torch.ones(64)}, folder.train(1) / checkpoint / "model.safetensors")
        torch.save({"state": torch.ones(64)}, folder.train(1) / checkpoint / "optimizer.pt")
    said = []
    assert resume_point(folder, state, 1, said.append) == damaged  # whole: the newest
    weights = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(weights[:-10])
    assert resume_point(folder, state, 1, said.append) == folder.train(1) / "checkpoint-4"
    need = len(weights)
    assert said == [
        f"not resuming from {damaged}: {damaged / 'model.safetensors'} has {need - 10} bytes; its "
        f"header says {need}; trying the checkpoint before it"
    ]
    (damaged / "model.safetensors").write_bytes(weights)
    optimizer = (damaged / "optimizer.pt").read_bytes()
    (damaged / "optimizer.pt").write_bytes(optimizer[: len(optimizer) // 2])
    said.clear()
    assert resume_point(folder, state, 1, said.append) == folder.train(1) / "checkpoint-4"
    assert said[0].startswith(f"not resuming from {damaged}: {damaged / 'optimizer.pt'} is cut short or damaged")
