"""Which checkpoint a round's training may resume from: one its own recipe wrote, intact.

Before round t trains, the runner records what it trains with, the round's recipe (less
`resume_from_checkpoint`) and its candidates' data, in `round-<t>/train/pofe-train.json`
(`record_training`): every checkpoint-N beside that file was written by that training. A
restart resumes only when its own recipe and data are the recorded ones
(`check_resume`): a run started again with another learning rate, after `pofe-run.json`
was lost, would otherwise continue the other run's training (and, at its last step,
train not at all). A mismatch is an error naming the checkpoint and the settings that
differ, not a fresh start: the checkpoints are another recipe's work, which POFE does not
delete on its own.

A checkpoint is resumed from only when it is whole (`checkpoint_problem`): its
trainer_state.json parses, no file is cut short (a full disk, a partial copy), and every part
transformers' Trainer reads back on resume is there (`missing_part`): the weights, the
optimizer and scheduler states and the RNG state, or under DeepSpeed the engine's own state
(`deepspeed_problem`). transformers resumes silently without an optimizer or scheduler file,
restarting Adam and the learning-rate warm-up from zero at the checkpoint's step; a cut
trainer_state.json fails every rerun. Any other is passed over, named with what is wrong, for
the one before it (`resumable`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pofe.files import file_sha256, not_json, stable_hash, write_atomic
from pofe.run.folder import RunStateMismatch, checkpoints
from pofe.run.weights import WEIGHTS, file_problem, weights_problem

# transformers.trainer's names for a checkpoint's parts, written out: importing that module in the
# runner costs 4 s and prints torchao's warnings to the console (a test holds them equal)
FSDP_MODEL_NAME = "pytorch_model_fsdp"
OPTIMIZER_NAME = "optimizer.pt"
OPTIMIZER_NAME_BIN = "optimizer.bin"
SCHEDULER_NAME = "scheduler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
RECORD_NAME = "pofe-train.json"
RECORD_VERSION = 1
DATA_KEY = "<candidates data.jsonl>"
# a rank's partition in DeepSpeed's global_step<N>/: `[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`
# (stage 3 also `zero_pp_rank_<r>_mp_rank_00_model_states.pt`; DeepSpeed still reads `..._00optim_states.pt`)
PARTITION = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_?(model|optim)_states\.pt")
# `Trainer._save_rng_state`: `rng_state.pth` from one process, `rng_state_<rank>.pth` from each of several
RNG_STATE = re.compile(r"rng_state(?:_(\d+))?\.pth")


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts flattened to dotted keys (`pofe.generate.seed`); other values kept."""
    if not isinstance(obj, dict) or not obj:
        return {prefix: obj}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def training_identity(recipe: dict, data: Path) -> dict[str, str]:
    """{setting: hash of its value} for every leaf of the round's recipe but
    `resume_from_checkpoint` (a resumed start differs from the first in that key only), and
    the hash of the candidates the round trains on. Hashes, not values: the record holds no
    key a recipe might carry (a served policy's `--api-key`)."""
    keys = {k: stable_hash(v, 16) for k, v in _leaves(recipe).items() if k != "resume_from_checkpoint"}
    keys[DATA_KEY] = file_sha256(data) or "none"
    return keys


def record_training(train_dir: Path, identity: dict[str, str]) -> None:
    """Write `pofe-train.json`: the checkpoints saved from now on are this training's."""
    record = {"version": RECORD_VERSION, "digest": stable_hash(identity), "keys": identity}
    write_atomic(train_dir / RECORD_NAME, json.dumps(record, indent=2, sort_keys=True) + "\n")


def check_resume(train_dir: Path, checkpoint: Path, identity: dict[str, str], t: int) -> None:
    """Raise RunStateMismatch unless `checkpoint` was written by a training of `identity`,
    naming the checkpoint and the settings that differ."""
    path = train_dir / RECORD_NAME
    fix = (
        f"Delete {train_dir} to train round {t} afresh with this recipe, or use a new output_dir "
        "(or restore the recipe that wrote it)."
    )
    try:
        recorded = json.loads(path.read_text())["keys"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RunStateMismatch(
            f"round {t} would resume from {checkpoint}, but {path} (the record of the recipe that wrote "
            "it) is missing or unreadable: another run's, or an older POFE's. " + fix
        ) from None
    if stable_hash(recorded) == stable_hash(identity):
        return
    differ = sorted(k for k in set(recorded) | set(identity) if recorded.get(k) != identity.get(k))
    raise RunStateMismatch(
        f"round {t} would resume from {checkpoint}, which a training with other settings wrote "
        f"(recorded in {path}; differs in: {', '.join(differ)}). " + fix
    )


def cut_file(checkpoint: Path) -> str | None:
    """The first file of `checkpoint` that is cut short, described; None when all look whole."""
    for path in sorted(checkpoint.rglob("*")):
        problem = file_problem(path) if path.is_file() else None
        if problem:
            return problem
    return None


def read_trainer_state(checkpoint: Path) -> dict | str:
    """The checkpoint's trainer_state.json, or why transformers could not read it (its
    `TrainerState.load_from_json` fails the rerun with a bare JSONDecodeError)."""
    path = checkpoint / TRAINER_STATE_NAME
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        return f"{path} {not_json(e)}"
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"{path} holds no global_step"
    return state


def _weights_problem(checkpoint: Path) -> str | None:
    """Why `Trainer._load_from_checkpoint` would find no weights whole (`pofe.run.weights`), or
    None. FSDP's own layout is taken as transformers takes it."""
    fsdp = (checkpoint / f"{FSDP_MODEL_NAME}.bin").is_file() or any(
        p.is_dir() and FSDP_MODEL_NAME in p.name for p in checkpoint.iterdir()
    )
    if fsdp and not any((checkpoint / name).is_file() for name in WEIGHTS):
        return None
    return weights_problem(checkpoint)


def missing_part(checkpoint: Path, state: dict, deepspeed: bool) -> str | None:
    """The part of a whole checkpoint that `checkpoint` lacks, described; None when it has all.

    What `Trainer._save_checkpoint` writes and `Trainer.train` reads back on resume: the
    weights (`_load_from_checkpoint`; under DeepSpeed, in the engine's state), the optimizer
    and scheduler (`_load_optimizer_and_scheduler`: without either it loads neither, and the
    run goes on with a new optimizer and its warm-up from zero; under DeepSpeed the optimizer
    is in global_step<N>/), and the RNG state (`_load_rng_state`). A checkpoint of a finished
    training (global_step at max_steps, as the runner's forced save is, with
    `save_only_model`) needs only its weights: resumed from, it trains no step.
    """
    if not deepspeed and (problem := _weights_problem(checkpoint)):
        return problem
    if state.get("max_steps") and state["global_step"] >= state["max_steps"]:
        return None
    optimizer = (
        deepspeed
        or (checkpoint / OPTIMIZER_NAME).is_file()
        or (checkpoint / OPTIMIZER_NAME_BIN).is_file()
        or any(p.is_dir() and "optimizer" in p.name for p in checkpoint.iterdir())  # FSDP's, as transformers looks
    )
    scheduler = deepspeed or (checkpoint / SCHEDULER_NAME).is_file()
    ranks = {m.group(1) for p in checkpoint.iterdir() if (m := RNG_STATE.fullmatch(p.name))}
    if not (optimizer or scheduler or ranks):
        return (
            f"{checkpoint} holds only the model, no {OPTIMIZER_NAME}, {SCHEDULER_NAME} or rng_state.pth "
            "(saved with save_only_model, which transformers documents cannot be resumed from)"
        )
    if not (optimizer and scheduler):
        lacks = " and ".join(
            name for name, found in ((OPTIMIZER_NAME, optimizer), (SCHEDULER_NAME, scheduler)) if not found
        )
        return (
            f"{checkpoint} lacks {lacks}: transformers loads the optimizer and scheduler only together, so "
            "the training would go on with Adam and the learning-rate warm-up started from zero"
        )
    if not ranks:
        return f"{checkpoint} lacks rng_state.pth (the random state the data order and dropout resume from)"
    numbered = {int(r) for r in ranks if r is not None}
    if numbered and (gone := sorted(set(range(max(numbered) + 1)) - numbered)):
        return f"{checkpoint} lacks the RNG state of rank(s) {gone} (rng_state_<rank>.pth)"
    return None


def checkpoint_problem(checkpoint: Path, deepspeed: bool = False) -> str | None:
    """Why `checkpoint` is not whole, or None: its trainer state unreadable, a file cut short,
    its DeepSpeed state (for a `deepspeed` recipe) or another part missing."""
    state = read_trainer_state(checkpoint)
    if isinstance(state, str):
        return state
    return (
        cut_file(checkpoint)
        or (deepspeed_problem(checkpoint) if deepspeed else None)
        or missing_part(checkpoint, state, deepspeed)
    )


def deepspeed_problem(checkpoint: Path) -> str | None:
    """Why DeepSpeed could not resume from `checkpoint`, or None.

    transformers resumes a DeepSpeed run only through the engine's `load_checkpoint`, which
    reads the folder that `latest` names, every rank its own partition of the optimizer (and,
    under ZeRO-3, of the weights): it fails, after the model has loaded, when one is missing
    (a partial copy). A checkpoint without that folder, saved with `save_only_model` (as
    the runner's forced save is), holds no DeepSpeed state at all: transformers stops with
    "Can't find a valid checkpoint". The ranks' files are all written when trainer_state.json
    is (DeepSpeed waits for every rank before returning), so a kill leaves none of this.
    """
    latest = checkpoint / "latest"
    if not latest.is_file():
        return (
            f"{checkpoint} holds no DeepSpeed state (no `latest` file naming its global_step folder; "
            "saved with save_only_model?)"
        )
    tag = checkpoint / latest.read_text().strip()
    if not tag.is_dir():
        return f"{latest} names {tag.name}, which {checkpoint} lacks"
    ranks: dict[str, set[int]] = {"model": set(), "optim": set()}
    for path in tag.iterdir():
        if m := PARTITION.fullmatch(path.name):
            ranks[m.group(2)].add(int(m.group(1)))
    if not ranks["optim"]:
        return f"{tag} holds no optimizer partition (*_optim_states.pt)"
    world = set(range(max(ranks["optim"] | ranks["model"]) + 1))
    for kind, found in ranks.items():
        # stage 1-2 keep the weights whole (mp_rank_00_model_states.pt): no per-rank model files
        if (found or kind == "optim") and found != world:
            return f"{tag} lacks the {kind} partition of rank(s) {sorted(world - found)} of {len(world)}"
    return None


def resumable(train_dir: Path, echo: Callable[[str], None], deepspeed: bool = False) -> Path | None:
    """The newest whole checkpoint (`checkpoint_problem`; with its DeepSpeed state for a
    `deepspeed` recipe); each newer one passed over is named, with what is wrong."""
    for checkpoint in reversed(checkpoints(train_dir)):
        problem = checkpoint_problem(checkpoint, deepspeed)
        if problem is None:
            return checkpoint
        echo(f"not resuming from {checkpoint}: {problem}; trying the checkpoint before it")
    return None
