"""Which checkpoint a round resumes from (`pofe.run.rounds.checkpoints`): its own recipe's, whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pofe.run.folder import RunFolder, RunState, RunStateMismatch
from pofe.run.rounds.round_recipe import round_recipe
from tests.helpers import ITERATED_RAW, whole_candidates

# what transformers' Trainer._save_checkpoint writes beside trainer_state.json (one process, no
# save_only_model), as a 5.16 Trainer wrote it for a tiny model: its weights (an adapter's under
# LoRA), the optimizer and scheduler states and the RNG state; config.json and training_args.bin
# are not read back on resume
PARTS = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")


def save_checkpoint(train: Path, step: int, max_steps: int = 20, parts=PARTS) -> Path:
    """checkpoint-<step>/ in `train` as transformers saves it, small: a safetensors file and
    torch zips of the names the Trainer writes, trainer_state.json last."""
    import torch
    from safetensors.torch import save_file

    checkpoint = train / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    for name in parts:
        if name.endswith(".safetensors"):
            save_file({"w": torch.ones(8)}, checkpoint / name)
        else:
            torch.save({"state": torch.ones(8)}, checkpoint / name)
    state = {"global_step": step, "max_steps": max_steps, "log_history": [{"loss": 1.0, "step": step}]}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state, indent=2))
    return checkpoint


def test_killed_training_resumes_from_its_last_complete_checkpoint(tmp_path, monkeypatch):
    """Round 1's train stage was killed after saving checkpoints 2, 9 and 10 and while
    saving 12 (no trainer_state.json yet). The restart's recipe resumes from 10: the
    highest complete step (by number: "checkpoint-9" sorts after "checkpoint-10" as text)."""
    import yaml

    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner

    folder = RunFolder(tmp_path / "run")
    train = folder.train(1)
    whole_candidates(folder, 1)
    # the killed start recorded what it trained with (its recipe had no resume_from_checkpoint)
    rounds.claim_training(folder, 1, round_recipe(ITERATED_RAW, folder, 1, "/m/base", seed=7).recipe, None)
    for step in (2, 9, 10):
        save_checkpoint(train, step)
    (train / "checkpoint-12").mkdir()
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
        save_checkpoint(folder.train(1), step)
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
    from pofe.run.rounds.loop import resume_point

    folder = RunFolder(tmp_path / "run")
    state = _killed_round_1(folder, ITERATED_RAW, steps=(4, 6))
    damaged = folder.train(1) / "checkpoint-6"
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


def _resume(folder: RunFolder, state: RunState) -> tuple[Path | None, list[str]]:
    from pofe.run.rounds.loop import resume_point

    said: list[str] = []
    return resume_point(folder, state, 1, said.append), said


@pytest.mark.parametrize(
    "gone, says",
    [
        (
            "optimizer.pt",
            "{c} lacks optimizer.pt: transformers loads the optimizer and scheduler only together, so the "
            "training would go on with Adam and the learning-rate warm-up started from zero",
        ),
        (
            "scheduler.pt",
            "{c} lacks scheduler.pt: transformers loads the optimizer and scheduler only together, so the "
            "training would go on with Adam and the learning-rate warm-up started from zero",
        ),
        ("rng_state.pth", "{c} lacks rng_state.pth (the random state the data order and dropout resume from)"),
        (
            "model.safetensors",
            "{c} holds no weights (none of model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
            "pytorch_model.bin.index.json, adapter_model.safetensors, adapter_model.bin)",
        ),
    ],
    ids=["optimizer", "scheduler", "rng", "weights"],
)
def test_a_checkpoint_missing_a_part_is_passed_over_for_the_whole_one_before_it(tmp_path, gone, says):
    """Bad case 4 of issue 33: with optimizer.pt deleted from the newest checkpoint, the resumed
    run went on from its step with a new Adam and its warm-up again (transformers loads the
    optimizer and scheduler only when both files are there, and says nothing otherwise).
    Now a checkpoint lacking any part the Trainer reads back on resume is passed over,
    named with the part, and the whole checkpoint-4 before it is resumed from."""
    folder = RunFolder(tmp_path / "run")
    state = _killed_round_1(folder, ITERATED_RAW, steps=(4, 6))
    newest = folder.train(1) / "checkpoint-6"
    assert _resume(folder, state) == (newest, [])  # whole: the newest
    (newest / gone).unlink()
    assert _resume(folder, state) == (
        folder.train(1) / "checkpoint-4",
        [f"not resuming from {newest}: {says.format(c=newest)}; trying the checkpoint before it"],
    )


def test_a_cut_trainer_state_is_passed_over_for_the_whole_checkpoint_before_it(tmp_path):
    """Weak case 11 of issue 33: checkpoint-6's trainer_state.json cut short (a full disk) was
    chosen, and every rerun failed in transformers' TrainerState.load_from_json with a bare
    JSONDecodeError though checkpoint-4 is whole. Now 6 is passed over, naming the file and
    where its JSON stops; one whose state has no global_step is too."""
    folder = RunFolder(tmp_path / "run")
    state = _killed_round_1(folder, ITERATED_RAW, steps=(4, 6))
    newest = folder.train(1) / "checkpoint-6"
    trainer_state = newest / "trainer_state.json"
    text = trainer_state.read_text()
    trainer_state.write_text(text[: text.index('"log_history"') + 20])
    assert _resume(folder, state) == (
        folder.train(1) / "checkpoint-4",
        [
            f"not resuming from {newest}: {trainer_state} is not valid JSON (Expecting value: line 5, "
            "column 4): cut short or edited; trying the checkpoint before it"
        ],
    )
    trainer_state.write_text(json.dumps({"max_steps": 20}))
    assert _resume(folder, state)[1] == [
        f"not resuming from {newest}: {trainer_state} holds no global_step; trying the checkpoint before it"
    ]


def test_a_sharded_checkpoint_needs_every_shard_its_index_names(tmp_path):
    """Weights saved in shards (model.safetensors.index.json and its files): one shard gone,
    the checkpoint is passed over naming it."""
    folder = RunFolder(tmp_path / "run")
    sharded = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", *PARTS[1:])
    state = _killed_round_1(folder, ITERATED_RAW, steps=(4,))
    newest = save_checkpoint(folder.train(1), 6, parts=sharded)
    index = {"metadata": {}, "weight_map": {"a.weight": sharded[0], "b.weight": sharded[1], "c.weight": sharded[1]}}
    (newest / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _resume(folder, state) == (newest, [])
    (newest / sharded[1]).unlink()
    assert _resume(folder, state) == (
        folder.train(1) / "checkpoint-4",
        [
            f"not resuming from {newest}: {newest} lacks {sharded[1]}, named in its model.safetensors.index.json; "
            "trying the checkpoint before it"
        ],
    )


def test_save_only_model_checkpoints_resume_only_where_training_had_finished(tmp_path):
    """save_only_model keeps the weights and trainer_state.json alone. The runner's forced save
    (save_strategy: no) is one at the last step, which a run killed before the train stage
    was recorded done resumes from and trains no step (as a 5.16 Trainer did: global_step 4 of
    4, train_loss 0): it stays resumable. One saved before the last step (the user's
    save_only_model) would go on with a new optimizer: passed over, and with none before it,
    the training starts afresh."""
    folder = RunFolder(tmp_path / "run")
    state = _killed_round_1(folder, ITERATED_RAW, steps=())
    only_model = ("model.safetensors",)
    early = save_checkpoint(folder.train(1), 10, parts=only_model)
    assert _resume(folder, state) == (
        None,
        [
            f"not resuming from {early}: {early} holds only the model, no optimizer.pt, scheduler.pt or "
            "rng_state.pth (saved with save_only_model, which transformers documents cannot be resumed from); "
            "trying the checkpoint before it"
        ],
    )
    last = save_checkpoint(folder.train(1), 20, parts=only_model)
    assert _resume(folder, state) == (last, [])


def test_every_rank_needs_its_rng_state(tmp_path):
    """Two processes save rng_state_0.pth and rng_state_1.pth; rank 0's gone, the checkpoint is
    passed over naming the rank."""
    folder = RunFolder(tmp_path / "run")
    state = _killed_round_1(folder, ITERATED_RAW, steps=(4,))
    ranks = ("rng_state_0.pth", "rng_state_1.pth")
    newest = save_checkpoint(folder.train(1), 6, parts=(*PARTS[:3], *ranks))
    assert _resume(folder, state) == (newest, [])
    (newest / ranks[0]).unlink()
    assert _resume(folder, state)[1] == [
        f"not resuming from {newest}: {newest} lacks the RNG state of rank(s) [0] (rng_state_<rank>.pth); "
        "trying the checkpoint before it"
    ]


def test_the_checkpoint_part_names_are_transformers_own():
    """checkpoints.py writes transformers.trainer's names out (importing it would cost the runner
    4 s and torchao's warnings): they must stay the ones the Trainer writes and reads."""
    import transformers.trainer as trainer

    from pofe.run.rounds import checkpoints

    names = ("FSDP_MODEL_NAME", "OPTIMIZER_NAME", "OPTIMIZER_NAME_BIN", "SCHEDULER_NAME", "TRAINER_STATE_NAME")
    assert {n: getattr(checkpoints, n) for n in names} == {n: getattr(trainer, n) for n in names}
