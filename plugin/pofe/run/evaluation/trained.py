"""`axolotl pofe eval` of one trained model: a recipe trained by `axolotl train` on datasets of its
own (k-response rows, pairs, or prompts), or any model given with `--model`.

The trained model (`--model`, else the recipe's `output_dir`: a model or a LoRA adapter) is
pi_1; the recipe's base model (with its `lora_model_dir`, when it trained from one) is pi_0.
Both answer the same held-out prompts and are judged as an iterated run's iterates are
(`pofe.run.evaluation.evaluate`): reward, the win rate of pi_1 against pi_0 raw and
length-controlled, lengths, KL to pi_0, and the same report. There is no headline (it compares
a round's model with the round's candidates, which a dataset of one's own does not have). A recipe
trained from prompts (`pofe.prompts`) has candidates of its own: their summary.json is copied, and the
report and console show their mean and best-of-k reward beside the training's loss.

The held-out prompts are the first of:
- `pofe.eval.prompts`, a file;
- `pofe.eval.held_out: n`, the last n rows of the recipe's dataset, which `axolotl train` held
  out of training (`pofe.data.held_out`: those rows and every row sharing their prompts);
- `val_set_size`, the rows axolotl's split kept from training (their prompts read back from the
  prepared rows; the ones some training row shares are counted).
The judge: `pofe.eval.judge`, else the recipe's `pofe.judge` (`pofe.eval.judge2` adds a second).
Prompts are rendered with the recipe's tokenizer as axolotl loads it, as training rendered them.

The evaluation's folder (`--output`, else `<model>/pofe-eval`) is laid out as a one-round run's
(`pofe.run.folder`), so evaluation and the report read it as they read a run:

    pofe-run.json               kind "trained": pi_0 and pi_1, the recipe, the command line's overrides
    round-1/recipe.yml          the recipe as evaluated (overrides applied)
    round-1/trainer_state.json  the training's log history (loss curves), from the model's last checkpoint
    round-1/candidates/summary.json  the candidates it trained on, from prompts (`pofe.prompts`): their counts and rewards
    prompts/held_out.jsonl      the held-out prompts as evaluated
    eval/, report.md, report.json, report-*.png
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import yaml

from pofe.errors import PofeError
from pofe.files import weights_fingerprint, write_atomic, write_jsonl_atomic
from pofe.locks import TRAIN_LOCK, describe, holder
from pofe.logs import Echo
from pofe.records.refresh import refresh_starts, written_refreshes
from pofe.run.evaluation.answers import HeldOut, other_columns, reference_pairs
from pofe.run.evaluation.inputs import EvalRun, checked_eval, prompt_file_rows, render_prompts, trained_as_text
from pofe.run.folder import RoundRecord, RunFolder, RunState, checkpoints
from pofe.run.recipe import recipe_fingerprint
from pofe.run.weights import weights_problem

NO_HEADLINE = (
    "one trained model's evaluation: the headline sets a round's model beside the round's own candidates, "
    "which a dataset of one's own does not have; the held-out prompts compare it with pi_0"
)
FOLDER = "pofe-eval"


def is_iterated(cfg) -> bool:
    """Whether the recipe's output_dir holds an iterated run (`axolotl pofe run`'s state)."""
    return RunFolder(Path(cfg.output_dir).resolve()).state.exists()


def trained_folder(model: str, output: str | Path | None) -> RunFolder:
    """Where a trained model's evaluation goes: `output`, else beside the model."""
    if output is None and not Path(model).is_dir():
        raise ValueError(f"{model} is not a local folder: give --output, where its evaluation and report go")
    return RunFolder(Path(output or Path(model) / FOLDER).resolve())


def report_folder(recipe_path: str, model: str | None, output: str | None, output_dir: str | None) -> RunFolder:
    """The folder `axolotl pofe report` reports on: the recipe's iterated run (its output_dir, or
    `output_dir` from the command line), else the trained model's evaluation of `model` or
    `output`, or of the output_dir's model (as `axolotl pofe eval` chose it)."""
    raw = yaml.safe_load(Path(recipe_path).read_text()) or {}
    out = output_dir or raw.get("output_dir")
    if model is None and output is None:
        if not out:
            raise ValueError(f"{recipe_path} sets no output_dir")
        run = RunFolder(Path(out).resolve())
        return run if run.state.exists() else RunFolder(run.root / FOLDER)
    return trained_folder(model or out, output)


def open_trained(
    recipe_path, raw: dict, cfg, model: str | None, output, overrides: dict | None, echo: Echo
) -> tuple[EvalRun, HeldOut, str, Callable[[], None]]:
    """The trained model's evaluation, set up once the model is found whole (`_check_model`): (its
    run, its held-out prompts, why it has no headline, what writes its state once it has run)."""
    from axolotl.loaders import load_tokenizer

    pcfg = checked_eval(recipe_path, cfg)
    if not pcfg.method:
        raise ValueError(f"{recipe_path} sets no `rl: rrhf` / `rl: sppo`")
    model = str(model or cfg.output_dir)
    _check_model(model, recipe_path)
    judge = pcfg.eval.judge or pcfg.judge
    if judge is None:
        raise ValueError(
            f"{recipe_path} names no judge to score the answers: set pofe.eval.judge (the keys of pofe.judge, "
            "e.g. {type: reward_model, model: ...})"
        )
    pcfg = pcfg.model_copy(update={"judge": judge})
    folder = trained_folder(model, output)
    pi_0 = _local(str(cfg.lora_model_dir or cfg.base_model))
    tokenizer = load_tokenizer(cfg)
    rows, source = _held_out_rows(cfg, pcfg)
    prompts = [r[pcfg.eval.prompt_column] for r in rows]
    as_text = trained_as_text(cfg, pcfg, prompts)  # rendered as training rendered them
    references = reference_pairs(tokenizer, prompts, [r.get(pcfg.eval.reference_column) for r in rows], as_text)
    folder.root.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(folder.held_out_prompts, rows)
    _copy_trainer_state(Path(model), folder)
    _copy_candidates_summary(cfg, pcfg, folder)
    echo(f"eval: {_local(model)} (pi_1) against {pi_0} (pi_0) on {len(prompts)} held-out prompts: {source}")
    run = EvalRun(pcfg, folder, [["pi_0", pi_0], ["pi_1", _local(model)]], tokenizer, pcfg.eval.prompt_column, 1)
    columns = other_columns(rows, pcfg.eval.prompt_column)
    held_out = HeldOut(prompts, render_prompts(tokenizer, prompts, as_text), references, source, columns)
    # the state last, once the evaluation has run: one that fails leaves none a report would read as one
    record = partial(_write_state, folder, recipe_path, raw, pcfg.method, pi_0, _local(model), overrides)
    return run, held_out, NO_HEADLINE, record


def _held_out_rows(cfg, pcfg) -> tuple[list[dict], str]:
    """The held-out rows ({prompt column: prompt, ...}) and where they came from."""
    from pofe.data.held_out import trained_held_out, validation_prompts

    ecfg = pcfg.eval
    if ecfg.prompts:
        return prompt_file_rows(ecfg.prompts), ecfg.prompts
    held, source = trained_held_out(cfg, pcfg)
    if held is not None:
        return [{**h["columns"], ecfg.prompt_column: h["prompt"]} for h in held], source
    prompts = None
    if cfg.val_set_size:
        from pofe.data.loader import load_pofe_datasets

        # the prepared rows, split as training split them (axolotl's own split, not shuffled)
        split = load_pofe_datasets(cfg, pcfg)
        prompts, seen = validation_prompts(split.train_dataset, split.eval_dataset)
        source = (
            f"the {len(prompts)} prompts of axolotl's validation split (val_set_size: {cfg.val_set_size}), "
            f"{seen} of them also in training rows"
        )
    if prompts is None:
        raise ValueError(
            "no held-out prompts to evaluate on: name a file with pofe.eval.prompts, or keep rows from training "
            "with pofe.eval.held_out: n (the dataset's last n rows) or val_set_size (then `axolotl train` again, "
            "so that the model never sees them)"
        )
    return [{ecfg.prompt_column: p} for p in prompts], source


class ModelNotWhole(PofeError, ValueError):
    """The model to evaluate is not there whole: absent, still training, or its weights cut."""


def _check_model(model: str, recipe_path) -> None:
    """The model must be whole before anything is written (`model_problem`); each refusal names the
    file and, when the folder has one, its newest whole checkpoint to evaluate instead. A name that
    is no local folder and cannot be a hub id's is refused as a missing folder; a hub id is left to
    the loader."""
    path = Path(model)
    if not path.exists():
        _check_absent(model, recipe_path)
        return
    problem = model_problem(path)
    if problem is not None:
        raise ModelNotWhole(f"{problem}: it cannot be evaluated. {_instead(path, recipe_path)}")


def model_problem(path: Path) -> str | None:
    """Why the model folder `path` is not whole now, or None: it holds no model or PEFT adapter, its
    config is not JSON (cut short), `axolotl train` still holds it (its `TRAIN_LOCK`), or its
    weights are not whole (`weights_problem`: every file and shard, none cut short)."""
    configs = [path / name for name in ("config.json", "adapter_config.json") if (path / name).is_file()]
    if not configs:
        return f"no trained model in {path} (no config.json or adapter_config.json)"
    for config in configs:
        try:
            json.loads(config.read_text())
        except ValueError as e:
            return f"{config} is not valid JSON ({e}): cut short or edited"
    training = holder(path / TRAIN_LOCK)
    if training is not None:
        return (
            f"{path} is still being trained (`axolotl train`, {describe(training)}): its weights are written when "
            "the training ends"
        )
    problem = weights_problem(path)
    if problem is not None and (path / "config.json").is_file() and "holds no weights" in problem:
        problem += (
            " (axolotl writes config.json when a training starts and the weights when it ends: this training "
            "did not end)"
        )
    return problem


def check_reportable(folder: RunFolder, recipe_path) -> None:
    """`axolotl pofe report` of `report_folder`'s folder: an iterated run's passes; a trained model's
    evaluation must be there (its state, written once it has run), and pi_1, when still on disk,
    whole now (`model_problem`): a report of it as it was evaluated would present a folder since
    retrained, cut or killed as that model."""
    if not folder.state.exists():
        raise ModelNotWhole(
            f"no evaluation in {folder.root}: `axolotl pofe eval {recipe_path}` (with the --model and --output "
            "given here) writes one, its pofe-run.json once it has run; an evaluation that stopped leaves none"
        )
    state = RunState.read(folder.state)
    model = Path(state.final_policy or "")
    if state.kind != "trained" or not model.is_dir() or (problem := model_problem(model)) is None:
        return
    raise ModelNotWhole(
        f"pi_1 is not whole now: {problem}. The evaluation in {folder.root} was of it as it was then; evaluate it "
        f"again once whole. {_instead(model, recipe_path)}"
    )


def _instead(path: Path, recipe_path) -> str:
    """What to do about a model folder that is not whole: wait for the training that holds it, or
    evaluate its newest whole checkpoint, or finish the training from it; train it again when it
    has none. An online training's refreshes are said as they are (`_refreshes_left`)."""
    training = holder(path / TRAIN_LOCK) is not None
    for checkpoint in reversed(checkpoints(path)):
        if weights_problem(checkpoint) is None:
            try:
                state = json.loads((checkpoint / "trainer_state.json").read_text())
                at = f" (step {state['global_step']} of {state['max_steps']})"
            except (OSError, ValueError, KeyError, TypeError):
                at = ""
            evaluate = f"evaluate it with --model {checkpoint}"
            if training:
                return (
                    f"Its newest whole checkpoint is {checkpoint}{at}: wait for the training to finish, or {evaluate}."
                )
            return (
                f"Its newest whole checkpoint is {checkpoint}{at}.{_refreshes_left(path)} Either {evaluate}, or "
                f"finish the training first: set resume_from_checkpoint: {checkpoint} in {recipe_path} and run "
                f"`axolotl train {recipe_path}` again."
            )
    if training:
        return "Wait for the training to finish: it has written no whole checkpoint yet."
    return f"It holds no whole checkpoint.{_refreshes_left(path)} Train it again (`axolotl train {recipe_path}`)."


def _refreshes_left(path: Path) -> str:
    """What an online training that did not end left in `path`'s online/ folder: its whole refreshes
    (the last one's step) and those cut short (a resumed training samples them again); "" when
    it trained offline."""
    starts = refresh_starts(path)
    if not starts:
        return ""
    whole = [r.start_step for r in written_refreshes(path)]
    cut = [s for s in starts if s not in whole]
    said = f" Its online training wrote {len(whole)} whole refreshes" + (
        f" (the last at step {whole[-1]})" if whole else ""
    )
    return said + (f", and {len(cut)} cut short (at steps {cut})." if cut else ".")


def _check_absent(model: str, recipe_path) -> None:
    """A model that is not on disk: refused when it can only be a local path (absolute, ./relative,
    or under a folder that exists here), naming what that folder holds; else a hub id, refused
    only offline and not in the hub's cache."""
    path = Path(model).expanduser()
    parent = path.parent
    if model.startswith((".", "/", "~")) or (str(parent) != "." and parent.is_dir()):
        near = sorted(p.name for p in parent.iterdir() if p.is_dir())[:8] if parent.is_dir() else []
        holds = f" ({parent} holds: {', '.join(near)})" if near else f" ({parent} does not exist either)"
        raise ModelNotWhole(
            f"no trained model at {path.resolve()}: no such folder{holds}. Run `axolotl train {recipe_path}` "
            "first, or give --model the folder of a trained model"
        )
    if os.environ.get("HF_HUB_OFFLINE") == "1" and weights_fingerprint(model) in ("not cached", "not found"):
        raise ModelNotWhole(
            f"no trained model at {model}: neither a local folder (from {Path.cwd()}) nor a model in the hub's "
            "cache, and HF_HUB_OFFLINE=1 forbids downloading it. Give --model a trained model's folder"
        )


def _local(path: str) -> str:
    return str(Path(path).resolve()) if Path(path).exists() else path


def _write_state(folder: RunFolder, recipe_path, raw: dict, method: str, pi_0: str, model: str, overrides) -> None:
    """pofe-run.json (kind "trained") and round-1/recipe.yml, written anew at each evaluation, once
    it has run."""
    state = RunState(
        folder.state,
        recipe=str(Path(recipe_path).resolve()),
        recipe_fingerprint=recipe_fingerprint(raw),
        method=method,
        rounds={"1": RoundRecord(policy_in=pi_0, policy_out=model)},
        rounds_planned=1,
        base_model=pi_0,
        pi_0=pi_0,
        final_policy=model,
        overrides=overrides or None,
        kind="trained",
    )
    folder.root.mkdir(parents=True, exist_ok=True)
    if folder.state.exists():
        state.starts = RunState.read(folder.state).starts
    state.starts.append(time.time())
    state.save()
    write_atomic(folder.recipe(1), yaml.safe_dump(raw, sort_keys=False), private=True)


def _copy_trainer_state(model: Path, folder: RunFolder) -> None:
    """The training's log history, for the report's loss curves: the model folder's last
    checkpoint's trainer_state.json (axolotl writes none beside the final model)."""
    saved = checkpoints(model) if model.is_dir() else []
    source = saved[-1] / "trainer_state.json" if saved else model / "trainer_state.json"
    if source.is_file():
        folder.trainer_state(1).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, folder.trainer_state(1))


def _copy_candidates_summary(cfg, pcfg, folder: RunFolder) -> None:
    """The summary.json of the candidates the recipe trained on, when its one dataset is prompts
    (`pofe.prompts`): the pipeline wrote them in its candidates folder (`pofe.data.candidates`);
    the report reads them as a round's. None there (a dataset of one's own): none here either."""
    from pofe.data.candidates import candidates_folder
    from pofe.data.formats import RowFormat

    target = folder.summary(1)
    entries = cfg.datasets or []
    source = None
    if len(entries) == 1 and entries[0].type == "pofe.prompts":
        fmt = RowFormat.of_entry(entries[0], 0, pcfg)
        source = (
            candidates_folder(cfg, pcfg, entries[0], fmt.column("field_prompt"), fmt.prompt_format) / "summary.json"
        )
    if source is None or not source.is_file():
        target.unlink(missing_ok=True)  # an earlier evaluation's, of another recipe
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
