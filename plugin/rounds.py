"""Iterated runs: `axolotl pofe run recipe.yml`.

For t = 1..T (`pofe.rounds`): generate candidates from the current policy, judge them,
build rows (`axolotl preprocess`), train (`axolotl train`), and make the trained model the
next round's policy. Every stage is its own process, so generation and training never
share one (nor their GPU memory). Each round gets a derived recipe, written into the run's
output dir, that differs from the user's recipe only in where things are:

    <output_dir>/
      pofe-run.json              the run's state: which stages finished (written atomically)
      prompts/round-<t>.jsonl    round t's prompts; prompts/held_out.jsonl (pofe.eval.held_out)
      round-<t>/recipe.yml       the derived recipe (base_model, output_dir,
                                 dataset_prepared_path, datasets[0].path, pofe.generate.model,
                                 pofe.generate.seed, pofe.candidates.out_dir)
      round-<t>/candidates/      the generate/judge pipeline's shards, data.jsonl, summary.json
      round-<t>/prepared/        tokenised rows (and SPPO's anchor table)
      round-<t>/train/           axolotl's output_dir (the model, or the LoRA adapter)
      round-<t>/merged/          LoRA/QLoRA: the adapter merged into the round's base
      round-<t>/trainer_state.json   the trainer's log history (loss curves)
      round-<t>/{preprocess,train,merge}.log
      eval/, report.md, report.json, report-*.png     (`axolotl pofe eval` / report)

Prompts per round (`pofe.round_prompts`): SPPO uses disjoint splits (round t trains on
slice t of T contiguous slices, as in the paper); RRHF's iterated variant (IP-n) resamples
the same prompts. SPPO re-anchors on each round's starting policy for free: the anchor
pass uses the policy as loaded, and round t loads round t-1's (merged) model.

LoRA / QLoRA: between rounds the adapter is merged into the round's base with peft's
`merge_and_unload` and saved as a full model, which becomes the next round's
`base_model` with a fresh adapter. QLoRA trains its adapter against the NF4-quantised
base, but the merge loads the base in floating point (bf16/fp16 as the recipe trains,
else float32) and adds the adapter there; the next round quantises the merged model again.
The difference (the adapter saw quantised weights) is the usual QLoRA-merge caveat.

A run killed at any point and started again skips every stage recorded as finished and
redoes the first unfinished one (an interrupted preprocess resumes from its shards).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

STATE_VERSION = 1
STATE_NAME = "pofe-run.json"
# Keys of the pofe block that may change between starts of one run without invalidating
# finished stages (rounds may grow when prompts are not split; eval settings only affect eval).
_FREE_POFE_KEYS = ("rounds", "eval")

Echo = Callable[[str], None]


# ---- layout and state ---------------------------------------------------------------------


@dataclass(frozen=True)
class RunLayout:
    """Where an iterated run keeps everything, under the recipe's output_dir."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / STATE_NAME

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


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and os.replace: all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunState:
    """The run's JSON state file: finished stages, round policies, starts.

    `stages[name] = {"status": "running" | "done", "started", "finished", "seconds", ...}`;
    only `done` stages are skipped on a restart. Every change rewrites the file atomically.
    """

    def __init__(self, path: Path, data: dict):
        self.path = path
        self.data = data

    @classmethod
    def open(cls, path: Path, *, fingerprint: str, recipe: str, method: str) -> "RunState":
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

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")

    def done(self, stage: str) -> bool:
        return self.data["stages"].get(stage, {}).get("status") == "done"

    def start(self, stage: str) -> None:
        self.data["stages"][stage] = {"status": "running", "started": time.time()}
        self.save()

    def finish(self, stage: str, **info: Any) -> None:
        rec = self.data["stages"][stage]
        now = time.time()
        rec.update(status="done", finished=now, seconds=round(now - rec["started"], 3), **info)
        self.save()

    def round(self, t: int) -> dict:
        return self.data["rounds"].setdefault(str(t), {})


class RunStateMismatch(RuntimeError):
    """The output_dir holds a run of another recipe."""


def recipe_fingerprint(raw: dict) -> str:
    """Hash of the recipe without the keys that may change between starts."""
    raw = copy.deepcopy(raw)
    pofe = raw.get("pofe") or {}
    for key in _FREE_POFE_KEYS:
        pofe.pop(key, None)
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


# ---- prompts --------------------------------------------------------------------------------


def split_prompts(n: int, rounds: int, mode: str) -> list[range]:
    """Row ranges per round: `split` cuts 0..n-1 into `rounds` contiguous disjoint slices
    (sizes differ by at most one, earlier slices larger); `all` gives every round 0..n-1."""
    if mode == "all":
        return [range(n)] * rounds
    if n < rounds:
        raise ValueError(f"{n} prompts cannot be split into {rounds} disjoint rounds")
    base, extra = divmod(n, rounds)
    out, start = [], 0
    for t in range(rounds):
        size = base + (1 if t < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def resolve_round_prompts(method: str, mode: str) -> str:
    if mode != "auto":
        return mode
    return "split" if method == "sppo" else "all"


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    write_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ---- derived recipes ---------------------------------------------------------------------------


def round_recipe(raw: dict, layout: RunLayout, t: int, policy: str, seed: int) -> dict:
    """Round t's recipe: the user's, pointed at round t's policy, prompts and folders.

    `save_strategy: no` becomes one save at the end (`steps` with a huge interval,
    `save_only_model`), so trainer_state.json (the loss curve) exists; the runner copies
    it out and removes that checkpoint.
    """
    r = copy.deepcopy(raw)
    r["base_model"] = policy
    for key in ("base_model_config", "tokenizer_config"):
        if t > 1 and key in r:
            r[key] = policy  # round t>1 loads everything from the previous iterate
    if t > 1:
        r.pop("lora_model_dir", None)  # merged into the policy already
    r["output_dir"] = str(layout.train(t))
    r["dataset_prepared_path"] = str(layout.prepared(t))
    (entry,) = r["datasets"]
    keep = {k: v for k, v in entry.items() if k == "type" or k.startswith("field_")}
    r["datasets"] = [{"path": str(layout.round_prompts(t)), "ds_type": "json", **keep}]
    pofe = r.setdefault("pofe", {})
    for key in ("rounds", "round_prompts", "eval"):
        pofe.pop(key, None)
    pofe["generate"] = {**pofe["generate"], "model": policy, "seed": seed}
    pofe["candidates"] = {**(pofe.get("candidates") or {}), "out_dir": str(layout.candidates(t))}
    if str(r.get("save_strategy", "")).lower() in ("no", "false"):
        r["save_strategy"] = "steps"
        r["save_steps"] = 1_000_000_000
        r["save_only_model"] = True
        r.pop("saves_per_epoch", None)
        r["_pofe_forced_save"] = True
    return r


# ---- running stages ----------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The children's environment: this venv's bin first (`axolotl train` runs `accelerate`)."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def axolotl_command(*args: str) -> list[str]:
    exe = Path(sys.executable).parent / "axolotl"
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "axolotl.cli.main", *args]


def run_logged(cmd: list[str], log: Path, echo: Echo, stream: bool) -> None:
    """Run `cmd`; its output goes to `log` (and the terminal when `stream`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(f"$ {' '.join(cmd)}   (log: {log})")
    with log.open("w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            if stream:
                sys.stdout.write(line)
        rc = proc.wait()
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise StageFailed(f"{' '.join(cmd)} exited with {rc}; last lines of {log}:\n{tail}")


class StageFailed(RuntimeError):
    """A stage's process exited with an error."""


def merge_dtype(raw: dict) -> str:
    """The float dtype the merge loads the base in: the recipe's training precision."""
    import torch

    bf16, fp16 = raw.get("bf16"), raw.get("fp16")
    if bf16 is True or (bf16 == "auto" and torch.cuda.is_available()):
        return "bfloat16"
    if fp16 is True:
        return "float16"
    return "float32"


def merge_adapter(base: str, adapter: str, out: str, dtype: str = "float32") -> None:
    """peft's merge_and_unload of `adapter` into `base` (loaded in `dtype`, never quantised),
    saved with the tokenizer as a full model at `out` (written to a temporary folder first)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_path = Path(out)
    tmp = out_path.with_name(out_path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model.save_pretrained(tmp)
    tok_dir = adapter if (Path(adapter) / "tokenizer_config.json").exists() else base
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(tmp)
    shutil.rmtree(out_path, ignore_errors=True)
    os.replace(tmp, out_path)


def collect_trainer_state(layout: RunLayout, t: int, forced_save: bool) -> Path | None:
    """Copy the last checkpoint's trainer_state.json to round-t/; drop the forced checkpoint."""
    train = layout.train(t)
    states = sorted(
        train.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1])
    )
    if not states:
        return None
    dest = layout.trainer_state(t)
    write_atomic(dest, states[-1].read_text())
    if forced_save:
        for ckpt in train.glob("checkpoint-*"):
            shutil.rmtree(ckpt)
    return dest


# ---- the run -------------------------------------------------------------------------------------


def load_recipe(recipe_path: str | Path):
    """(raw YAML dict, axolotl's validated cfg) of the user's recipe."""
    from axolotl.cli.config import load_cfg

    raw = yaml.safe_load(Path(recipe_path).read_text())
    cfg = load_cfg(str(recipe_path))
    return raw, cfg


def check_iterable(cfg) -> None:
    pofe = cfg.pofe
    if not pofe or not pofe.method:
        raise ValueError("the recipe sets no `rl: rrhf` / `rl: sppo`")
    entries = cfg.datasets or []
    if len(entries) != 1 or entries[0].type != "pofe.prompts":
        raise ValueError(
            "an iterated run needs exactly one dataset, of type pofe.prompts (each round "
            f"generates its candidates from it); got {[e.type for e in entries]}"
        )


def policy_dir(layout: RunLayout, t: int, adapter: bool) -> Path:
    """The model round t produced (round t+1's policy)."""
    return layout.merged(t) if adapter else layout.train(t)


def prepare_prompts(cfg, layout: RunLayout, state: RunState, echo: Echo) -> None:
    """Write the per-round prompt files (and held-out prompts) once."""
    if state.done("prompts"):
        return
    from axolotl.utils.data.shared import load_dataset_with_config

    state.start("prompts")
    rows = load_dataset_with_config(cfg.datasets[0], cfg.hf_use_auth_token).to_list()
    held = cfg.pofe.eval.held_out if cfg.pofe.eval else 0
    if held >= len(rows):
        raise ValueError(f"pofe.eval.held_out={held} leaves none of the {len(rows)} prompts to train on")
    train_rows, held_rows = rows[: len(rows) - held], rows[len(rows) - held :]
    if held:
        _write_jsonl(layout.held_out_prompts, held_rows)
    mode = resolve_round_prompts(cfg.pofe.method, cfg.pofe.round_prompts)
    splits = split_prompts(len(train_rows), cfg.pofe.rounds, mode)
    for t, rng in enumerate(splits, start=1):
        _write_jsonl(layout.round_prompts(t), [train_rows[i] for i in rng])
    state.data["prompt_mode"] = mode
    state.data["rounds_planned"] = cfg.pofe.rounds
    state.finish(
        "prompts", total=len(rows), held_out=held, mode=mode,
        per_round=[[r.start, r.stop] for r in splits],
    )
    echo(f"prompts: {len(train_rows)} for training ({mode} over {cfg.pofe.rounds} rounds), {held} held out")


def check_rounds(cfg, state: RunState, layout: RunLayout) -> None:
    """More rounds than planned: fine with `all` (write the new rounds' prompts); a split
    depends on the number of rounds, so it cannot change once prompts are written."""
    planned = state.data.get("rounds_planned")
    if planned is None or planned == cfg.pofe.rounds:
        return
    if state.data.get("prompt_mode") == "split":
        raise RunStateMismatch(
            f"this run split its prompts into {planned} rounds; pofe.rounds: {cfg.pofe.rounds} "
            "would need another split. Use a new output_dir (or round_prompts: all)."
        )
    for t in range(planned + 1, cfg.pofe.rounds + 1):
        if not layout.round_prompts(t).exists():
            shutil.copyfile(layout.round_prompts(1), layout.round_prompts(t))
    state.data["rounds_planned"] = max(planned, cfg.pofe.rounds)
    state.save()


def run(
    recipe_path: str | Path,
    *,
    launcher: str | None = None,
    stream: bool = True,
    echo: Echo = print,
    evaluate: bool = True,
) -> RunLayout:
    """Run (or resume) every round of `recipe_path`, then evaluate and report."""
    raw, cfg = load_recipe(recipe_path)
    check_iterable(cfg)
    layout = RunLayout(Path(cfg.output_dir).resolve())
    layout.root.mkdir(parents=True, exist_ok=True)
    state = RunState.open(
        layout.state, fingerprint=recipe_fingerprint(raw), recipe=str(Path(recipe_path).resolve()),
        method=cfg.pofe.method,
    )
    prepare_prompts(cfg, layout, state, echo)
    check_rounds(cfg, state, layout)
    adapter = bool(cfg.adapter)
    base_seed = int((cfg.pofe.generate or {}).get("seed") or 0)
    policy = _local_or_hub(str(raw["base_model"]))
    state.data["base_model"] = policy
    # pi_0 of the evaluation: the policy round 1 starts from (with its adapter, if any)
    state.data["pi_0"] = _local_or_hub(str(raw["lora_model_dir"])) if raw.get("lora_model_dir") else policy
    for t in range(1, cfg.pofe.rounds + 1):
        info = state.round(t)
        seed = base_seed + (t - 1)
        info.update(policy_in=policy, generate_seed=seed)
        rr = round_recipe(raw, layout, t, policy, seed)
        forced = bool(rr.pop("_pofe_forced_save", False))
        text = yaml.safe_dump(rr, sort_keys=False)
        path = layout.recipe(t)
        if not path.exists() or path.read_text() != text:
            write_atomic(path, text)
        rd = layout.round_dir(t)

        stage = f"round-{t}/preprocess"
        if not state.done(stage):
            echo(f"round {t}/{cfg.pofe.rounds}: generate + judge + tokenise from {policy}")
            state.start(stage)
            run_logged(axolotl_command("preprocess", str(path)), rd / "preprocess.log", echo, stream)
            state.finish(stage, summary=str(layout.candidates(t) / "summary.json"))

        stage = f"round-{t}/train"
        if not state.done(stage):
            echo(f"round {t}/{cfg.pofe.rounds}: train")
            state.start(stage)
            extra = ["--launcher", launcher] if launcher else []
            run_logged(axolotl_command("train", str(path), *extra), rd / "train.log", echo, stream)
            ts = collect_trainer_state(layout, t, forced)
            state.finish(stage, output_dir=str(layout.train(t)), trainer_state=str(ts) if ts else None)

        if adapter:
            stage = f"round-{t}/merge"
            if not state.done(stage):
                echo(f"round {t}/{cfg.pofe.rounds}: merge the adapter into {policy}")
                state.start(stage)
                cmd = [sys.executable, "-m", "pofe.rounds", "merge", policy, str(layout.train(t)),
                       str(layout.merged(t)), merge_dtype(raw)]
                run_logged(cmd, rd / "merge.log", echo, stream)
                state.finish(stage, merged=str(layout.merged(t)))

        policy = str(policy_dir(layout, t, adapter))
        info["policy_out"] = policy
        state.save()

    state.data["final_policy"] = policy
    state.save()
    if evaluate and cfg.pofe.eval is not None:
        models = eval_models(state, cfg.pofe.rounds)
        if not (state.done("eval") and state.data["stages"]["eval"].get("models") == models):
            echo("evaluate every iterate on held-out prompts")
            state.start("eval")
            run_logged(axolotl_command("pofe", "eval", str(recipe_path)), layout.root / "eval.log", echo, stream)
            state.finish("eval", models=models)
    from .report import write_report

    report = write_report(layout, cfg)
    echo(report.terminal_summary())
    return layout


def eval_models(state: RunState, rounds: int | None = None) -> list[list[str]]:
    """[[name, path], ...]: pi_0 (the recipe's base_model) and every finished round's model."""
    models = [["pi_0", state.data.get("pi_0", state.data["base_model"])]]
    for t in range(1, (rounds or len(state.data["rounds"])) + 1):
        out = state.data["rounds"].get(str(t), {}).get("policy_out")
        if out is None:
            break
        models.append([f"pi_{t}", out])
    return models


def _local_or_hub(path: str) -> str:
    """An existing local path made absolute (derived recipes live elsewhere); else a hub id."""
    return str(Path(path).resolve()) if Path(path).exists() else path


def _main(argv: list[str]) -> None:
    """`python -m pofe.rounds merge BASE ADAPTER OUT DTYPE` (the runner's merge stage)."""
    if len(argv) == 5 and argv[0] == "merge":
        merge_adapter(*argv[1:])
        return
    raise SystemExit("usage: python -m pofe.rounds merge BASE ADAPTER OUT DTYPE")


if __name__ == "__main__":
    _main(sys.argv[1:])
