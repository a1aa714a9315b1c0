"""Where an iterated run keeps its files, and its resumable state file.

<output_dir>/
  pofe-run.json              the run's state: which stages finished (written atomically)
  pofe-run.lock              held while a runner (or a stage it started) lives (`pofe.run.guards`)
  pofe-preexisting.json      pofe.overwrite_output_dir: the files found there first (`pofe.run.guards`)
  prompts/round-<t>.jsonl    round t's prompts; prompts/held_out.jsonl (pofe.eval.held_out)
  round-<t>/recipe.yml       the derived recipe (`pofe.run.recipe.round_recipe`)
  round-<t>/candidates/      the generate/judge pipeline's shards, data.jsonl, summary.json
  round-<t>/prepared/        tokenised rows (and SPPO's anchor table)
  round-<t>/train/           axolotl's output_dir (the model, or the LoRA adapter; checkpoint-<step>/;
                             pofe-train.json: what its checkpoints were trained with, `pofe.run.rounds.checkpoints`)
  round-<t>/merged/          LoRA/QLoRA: the adapter merged into the round's base
  round-<t>/trainer_state.json   the trainer's log history (loss curves)
  round-<t>/{preprocess,train,merge}.log
  eval/, report.md, report.json, report-*.png     (`axolotl pofe eval` / report)
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pofe.files import write_atomic

STATE_VERSION = 1
STATE_NAME = "pofe-run.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")


@dataclass(frozen=True)
class RunFolder:
    """Where an iterated run keeps everything, under the recipe's output_dir."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / STATE_NAME

    @property
    def lock(self) -> Path:
        return self.root / "pofe-run.lock"

    def round_dir(self, t: int) -> Path:
        return self.root / f"round-{t}"

    def round_prompts(self, t: int) -> Path:
        return self.root / "prompts" / f"round-{t}.jsonl"

    @property
    def held_out_prompts(self) -> Path:
        return self.root / "prompts" / "held_out.jsonl"

    def recipe(self, t: int) -> Path:
        return self.round_dir(t) / "recipe.yml"

    def candidates(self, t: int) -> Path:
        return self.round_dir(t) / "candidates"

    def prepared(self, t: int) -> Path:
        return self.round_dir(t) / "prepared"

    def train(self, t: int) -> Path:
        return self.round_dir(t) / "train"

    def merged(self, t: int) -> Path:
        return self.round_dir(t) / "merged"

    def trainer_state(self, t: int) -> Path:
        return self.round_dir(t) / "trainer_state.json"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"


def checkpoints(train_dir: Path) -> list[Path]:
    """The trainer's complete checkpoints in `train_dir`, by step. The trainer writes
    trainer_state.json last, so a checkpoint without one was cut short by a kill."""
    found = [
        (int(m.group(1)), p)
        for p in train_dir.glob("checkpoint-*")
        if (m := CHECKPOINT.fullmatch(p.name)) and (p / "trainer_state.json").is_file()
    ]
    return [p for _, p in sorted(found)]


class RunStateMismatch(RuntimeError):
    """The output_dir holds a run of another recipe."""


class RunState:
    """The run's JSON state file: finished stages, round policies, starts.

    `stages[name] = {"status": "running" | "done", "started", "finished", "seconds", ...}`;
    only `done` stages are skipped on a restart. Every change rewrites the file atomically.
    """

    def __init__(self, path: Path, data: dict):
        self.path = path
        self.data = data

    @classmethod
    def open(cls, path: Path, *, fingerprint: str, recipe: str, method: str) -> RunState:
        """Load the state (refusing another recipe's) or start one; records this start."""
        if path.exists():
            data = json.loads(path.read_text())
            if data.get("recipe_fingerprint") != fingerprint:
                raise RunStateMismatch(
                    f"{path} belongs to a run of a different recipe (its settings changed since "
                    "the run started). Use a new output_dir, or delete this one to start over."
                )
        else:
            data = {
                "version": STATE_VERSION,
                "recipe": recipe,
                "recipe_fingerprint": fingerprint,
                "method": method,
                "stages": {},
                "rounds": {},
                "starts": [],
            }
        state = cls(path, data)
        state.data["starts"].append(time.time())
        state.save()
        return state

    @classmethod
    def read(cls, path: Path) -> RunState:
        """The state as it is on disk, without recording a start."""
        return cls(path, json.loads(path.read_text()))

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")

    def done(self, stage: str) -> bool:
        return self.data["stages"].get(stage, {}).get("status") == "done"

    def start(self, stage: str, **info: Any) -> None:
        self.data["stages"][stage] = {"status": "running", "started": time.time(), **info}
        self.save()

    def finish(self, stage: str, **info: Any) -> None:
        record = self.data["stages"][stage]
        now = time.time()
        record.update(status="done", finished=now, seconds=round(now - record["started"], 3), **info)
        self.save()

    def round(self, t: int) -> dict:
        return self.data["rounds"].setdefault(str(t), {})
