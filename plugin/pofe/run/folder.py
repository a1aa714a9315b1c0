"""Where an iterated run keeps its files, and its resumable state file.

<output_dir>/
  pofe-run.json              the run's state: which stages finished (written atomically)
  pofe-run.lock              held while a runner (or a stage it started) lives (`pofe.run.guards`)
  pofe-preexisting.json      pofe.overwrite_output_dir: the files found there first (`pofe.run.guards`)
  pofe-recipe.yml            with command-line overrides: the recipe with them applied, which the
                             eval stage reads (each round's recipe.yml is derived from it)
  prompts/round-<t>.jsonl    round t's prompts; prompts/held_out.jsonl (pofe.eval.held_out)
  round-<t>/recipe.yml       the derived recipe (`pofe.run.rounds.round_recipe`)
  round-<t>/candidates/      the generate/judge pipeline's shards, data.jsonl, summary.json
  round-<t>/prepared/        tokenised rows (and SPPO's anchor table)
  round-<t>/train/           axolotl's output_dir (the model, or the LoRA adapter; checkpoint-<step>/;
                             pofe-train.json: what its checkpoints were trained with, `pofe.run.rounds.checkpoints`)
  round-<t>/merged/          LoRA/QLoRA: the adapter merged into the round's base
  round-<t>/trainer_state.json   the trainer's log history (loss curves)
  round-<t>/{preprocess,train,merge}.log
  eval/, report.md, report.json, report-*.png     (`axolotl pofe eval` / report)

A trained model's evaluation (`axolotl pofe eval` without an iterated run,
`pofe.run.evaluation.trained`) is laid out as a one-round run's, `kind: trained` in its state.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pofe.errors import PofeError
from pofe.files import not_json, read_utf8, write_atomic

# 2: prompt_sources digests are pofe.files.stable_hash over (name, sha256) pairs, and the caches
# a resumed round reads (prepared rows, SPPO's anchor table) are keyed by pofe.files' hashes
STATE_VERSION = 2
STATE_NAME = "pofe-run.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
# what to do about eval/eval.json or eval/headline.json cut short or of an older form: the
# evaluation writes both anew
REWRITE_EVAL = "The evaluation writes it: run `axolotl pofe eval` on the run's recipe again to rewrite it."


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

    @property
    def runner_log(self) -> Path:
        """What the runner's own process printed while axolotl loaded the recipe (its config
        dump, library warnings), kept off the console."""
        return self.root / "pofe-run.log"

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

    def summary(self, t: int) -> Path:
        """Round t's candidates/summary.json (`pofe.records.candidates`)."""
        return self.candidates(t) / "summary.json"

    def rewrite_summary(self, t: int) -> str:
        """What rewrites round t's summary.json."""
        return (
            f"Round {t}'s preprocess stage writes it with data.jsonl from the shards beside it: "
            f"`axolotl preprocess {self.recipe(t)}` writes both again."
        )

    @property
    def headline(self) -> Path:
        return self.eval_dir / "headline.json"

    @property
    def evaluation(self) -> Path:
        """eval/eval.json (`pofe.records.evaluation`)."""
        return self.eval_dir / "eval.json"

    @property
    def recipe_as_run(self) -> Path:
        return self.root / "pofe-recipe.yml"


def checkpoints(train_dir: Path) -> list[Path]:
    """The trainer's complete checkpoints in `train_dir`, by step. The trainer writes
    trainer_state.json last, so a checkpoint without one was cut short by a kill."""
    found = [
        (int(m.group(1)), p)
        for p in train_dir.glob("checkpoint-*")
        if (m := CHECKPOINT.fullmatch(p.name)) and (p / "trainer_state.json").is_file()
    ]
    return [p for _, p in sorted(found)]


class RunStateMismatch(PofeError, RuntimeError):
    """The output_dir holds a run of another recipe."""


@dataclass
class RoundRecord:
    """What a run records of round t: the policy it started from, its generation seed, and
    the model it produced (None until its stages are done)."""

    policy_in: str | None = None
    generate_seed: int | None = None
    policy_out: str | None = None


@dataclass
class RunState:
    """The run's state file, `pofe-run.json`: what it is a run of, its stages and rounds.

    `stages[name]` is a stage's record: `{"status": "running" | "done", "started",
    "finished", "seconds", ...}` and the facts the stage returned (`pofe.run.rounds.runner`);
    only `done` stages are skipped on a restart. Every change rewrites the file atomically.
    """

    path: Path
    recipe: str
    recipe_fingerprint: str
    method: str
    version: int = STATE_VERSION
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    rounds: dict[str, RoundRecord] = field(default_factory=dict)
    starts: list[float] = field(default_factory=list)  # time.time() of each start of the runner
    # set by the prompts stage: `split` | `all` | `files`, and the rounds its prompts were written for
    prompt_mode: str | None = None
    rounds_planned: int | None = None
    prompt_sources: dict[str, str] | None = None  # {local prompt file: sha256} at the first start
    base_model: str | None = None  # round 1's policy
    pi_0: str | None = None  # evaluation's pi_0: round 1's policy with its adapter, if any
    stopped: dict[str, Any] | None = None  # the `pofe.stop_when` decision that ended the run
    final_policy: str | None = None
    # axolotl's command-line overrides the run was started with ({"num_epochs": 3, ...})
    overrides: dict[str, Any] | None = None
    # "rounds": an iterated run; "trained": one trained model's evaluation (pi_1) against its base
    kind: str = "rounds"

    @classmethod
    def open(cls, path: Path, *, fingerprint: str, recipe: str, method: str) -> RunState:
        """Load the state (refusing another recipe's) or start one; records this start."""
        if path.exists():
            state = cls.read(path)
            if state.version != STATE_VERSION:
                raise RunStateMismatch(
                    f"{path} was written by a POFE whose run state is version {state.version}; this one "
                    f"reads version {STATE_VERSION} (its caches are keyed differently). Finish the run with "
                    "that POFE, or start it again in a new output_dir."
                )
            if state.recipe_fingerprint != fingerprint:
                raise RunStateMismatch(
                    f"{path} belongs to a run of a different recipe (its settings changed since "
                    "the run started). Use a new output_dir, or delete this one to start over."
                )
        else:
            state = cls(path, recipe=recipe, recipe_fingerprint=fingerprint, method=method)
        state.starts.append(time.time())
        state.save()
        return state

    @classmethod
    def read(cls, path: Path) -> RunState:
        """The state as it is on disk, without recording a start.

        Without it a run starts again with no stage done (`axolotl pofe run`): each stage is
        redone, reusing what it checks as this recipe's (the candidates' shards, its prepared
        rows, the training checkpoints left); a round whose forced checkpoint was removed
        trains again. A cut one is refused saying so.
        """
        try:
            data = json.loads(read_utf8(path))
        except json.JSONDecodeError as e:
            raise RunStateMismatch(
                f"{path} {not_json(e)}. It is the run's record of which stages are done: restore it from a "
                f"backup and run again to go on where the run stopped; or move it aside (mv {path} "
                f"{path}.broken) and run again, which redoes every stage, reusing the candidates' shards and "
                "the training checkpoints this recipe wrote (a finished round may train again); or start afresh "
                "with a new output_dir."
            ) from None
        try:
            rounds = {t: RoundRecord(**r) for t, r in data.pop("rounds").items()}
            return cls(path, rounds=rounds, **data)
        except (AttributeError, KeyError, TypeError) as e:
            raise RunStateMismatch(
                f"{path} is not a POFE run's state file ({type(e).__name__}: {e}); it was edited or written "
                "by another version. Use a new output_dir, or delete this one to start over."
            ) from e

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        write_atomic(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def done(self, stage: str) -> bool:
        return self.stages.get(stage, {}).get("status") == "done"

    def start(self, stage: str, **info: Any) -> None:
        self.stages[stage] = {"status": "running", "started": time.time(), **info}
        self.save()

    def finish(self, stage: str, **info: Any) -> None:
        record = self.stages[stage]
        now = time.time()
        record.update(status="done", finished=now, seconds=round(now - record["started"], 3), **info)
        self.save()

    def forget(self, stage: str) -> None:
        """Mark `stage` unfinished: the next start runs it again."""
        self.stages.pop(stage, None)
        self.save()

    def round(self, t: int) -> RoundRecord:
        return self.rounds.setdefault(str(t), RoundRecord())

    def models(self, rounds: int | None = None) -> list[list[str]]:
        """[[name, path], ...]: pi_0 and every finished round's model, in order (the first
        `rounds` rounds'; all when None): the models evaluation compares."""
        models = [["pi_0", self.pi_0 or self.base_model]]
        for t in range(1, (rounds or len(self.rounds)) + 1):
            out = self.rounds.get(str(t), RoundRecord()).policy_out
            if out is None:
                break
            models.append([f"pi_{t}", out])
        return models
