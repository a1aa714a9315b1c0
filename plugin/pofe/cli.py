"""`axolotl pofe ...`: POFE's stages on their own (registered as an axolotl CLI plugin)."""

from __future__ import annotations

import io
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import click

from pofe.compat.axolotl_internals import axolotl_overrides
from pofe.errors import PofeError, record_error


class PofeGroup(click.Group):
    """`axolotl pofe`: a POFE error, or bad input, is shown as its message, not a traceback.

    Bad input includes `ValueError`: a recipe that fails validation (pydantic's errors name
    the key) and a value POFE refuses both raise one, with the fix in the message.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (PofeError, ValueError) as e:
            record_error(e)  # run as a stage of `axolotl pofe run`: the runner shows this message
            raise click.ClickException(str(e)) from e


@contextmanager
def json_stdout() -> Iterator[TextIO]:
    """The stream a `--json` command writes its JSON to; anything else the process prints from
    here on (through Python or a C library: torchao's warnings as the planner loads models'
    code, axolotl's log lines) goes to stderr, by moving file descriptor 1 onto stderr's.

    `python -m pofe.cli plan --json` prints the JSON alone. Under `axolotl pofe` the JSON follows
    axolotl's banner, which its CLI prints and flushes (colorama wraps stdout when axolotl.cli is
    imported) before it imports a plugin's command: nothing of POFE runs before it. Under click's
    CliRunner (no file descriptor) the command's own stream is used as it is.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        yield sys.stdout
        return
    saved = os.dup(fd)
    os.dup2(sys.stderr.fileno(), fd)  # for good: stdout's buffer is flushed (to stderr) at exit
    with os.fdopen(saved, "w", encoding="utf-8") as out:
        yield out


class FiniteFloat(click.FloatRange):
    """A `click.FloatRange` that refuses nan and inf: nan passes every comparison of the range
    check (`nan < 1` is false), and inf passes an open upper bound."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


@click.group(cls=PofeGroup, help="POFE (RRHF, SPPO, Nash-MD) tools.")
def pofe():
    pass


@pofe.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--stage",
    type=click.Choice(["generate", "judge", "all"]),
    default="all",
    show_default=True,
    help="Stop after this stage; a later run resumes from its shards.",
)
def candidates(config: str, stage: str):
    """Generate and judge candidates for CONFIG's pofe.prompts datasets.

    The same pipeline `axolotl preprocess` runs, without tokenising for training:
    for users who generate on one machine and judge or train on another.
    """
    from pofe.args import pofe_config
    from pofe.data.candidates import build_candidates
    from pofe.data.formats import RowFormat
    from pofe.data.sources import load_entry
    from pofe.run.recipe import load_recipe

    _, cfg = load_recipe(config)
    pcfg = pofe_config(cfg)
    if not pcfg.method:
        raise click.UsageError(f"{config} sets no `rl: rrhf` / `rl: sppo`")
    entries = [(i, e) for i, e in enumerate(cfg.datasets or []) if e.type == "pofe.prompts"]
    if not entries:
        raise click.UsageError(f"{config} has no dataset of type pofe.prompts")
    for i, entry in entries:
        fields = pcfg.dataset_fields[i] if i < len(pcfg.dataset_fields) else {}
        fmt = RowFormat(dataset=entry.path, type=entry.type, method=pcfg.method, fields=fields)
        prompts = load_entry(entry, cfg.hf_use_auth_token)
        result = build_candidates(
            cfg,
            pcfg,
            entry,
            prompts,
            fmt.column("field_prompt"),
            stop_after=None if stage == "all" else stage,
            prompt_format=fmt.prompt_format,
        )
        if result is not None:
            click.echo(f"{entry.path}: {result.rows} rows -> {result.data_path}")


@pofe.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--launcher",
    type=click.Choice(["accelerate", "torchrun", "python"]),
    default=None,
    help="Passed to each round's `axolotl train` (default: axolotl's own, accelerate).",
)
@click.option("--verbose", is_flag=True, help="Also stream every stage's whole output (always in its log file).")
@click.option("--quiet", is_flag=True, help="No progress bars: POFE's own lines only (for logs and CI).")
@click.option(
    "--no-eval", is_flag=True, help="Skip evaluation: the report's headline and held-out prompts (pofe.eval)."
)
@axolotl_overrides  # drops the options left None: they need defaults here
def run(
    config: str,
    launcher: str | None = None,
    verbose: bool = False,
    quiet: bool = False,
    no_eval: bool = False,
    **overrides,
):
    """Iterated run of CONFIG: pofe.rounds x (generate -> judge -> train), then eval and report.

    Each stage is a separate process, ended with the run, its whole output in a log file
    beside its results; the terminal shows one line as a stage starts, one as it ends (what it
    made, how long it took, its log) and, on a terminal, its progress bars. A killed run
    started again resumes at the first unfinished stage (state in <output_dir>/pofe-run.json),
    a killed training from its last checkpoint. One run per output_dir at a time (pofe-run.lock).
    axolotl's options (--num-epochs 3, ...) apply to every stage, recorded in pofe-run.json.
    """
    from pofe.run.rounds.loop import run_rounds
    from pofe.run.rounds.runner import StatusLine

    progress = None if quiet or not StatusLine.possible() else StatusLine()
    run_rounds(
        config,
        launcher=launcher,
        stream=verbose,
        evaluate=not no_eval,
        echo=click.echo,
        progress=progress,
        overrides=overrides,
    )


@pofe.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON: one entry per stage.")
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs on the node (ZeRO-3 shards over them; each data-parallel rank holds a copy otherwise). "
    "Default: this machine's, else 1 (the plan says it assumed it).",
)
@click.option(
    "--gpu-memory",
    type=FiniteFloat(min=1),
    default=None,
    help="GB per GPU. Default: this machine's first GPU's, else 80 (the plan says it assumed it).",
)
@click.option(
    "--command",
    type=click.Choice(["train", "run"]),
    default=None,
    help="Plan `axolotl train` on the recipe (its preprocess and one training, then `axolotl pofe eval`) or "
    "the rounds of `axolotl pofe run`. Default: run when the recipe sets pofe.rounds, else train.",
)
@click.option(
    "--prompts",
    type=click.IntRange(min=1),
    default=None,
    help="Prompts in the dataset where they cannot be counted offline (a hub dataset); per round "
    "when pofe.round_prompts lists one dataset per round.",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    default=None,
    help="Plan a GPU (cuda) or a CPU run (memory: the process's resident set). Default: the recipe's, "
    "cpu when it sets bf16: false, as CPU recipes do.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the JSON plan to this file as well (under `axolotl pofe`, stdout starts with axolotl's banner).",
)
def plan(
    config: str,
    as_json: bool,
    gpus: int | None,
    gpu_memory: float | None,
    command: str | None,
    prompts: int | None,
    device: str | None,
    output: str | None,
):
    """The plan of CONFIG's run before it starts: for each stage of each round, what loads where,
    the estimated peak memory per GPU, the disk, the counts; warnings name the key to change.
    Reads config.json files from disk or the hub cache only: never downloads."""
    import json

    from pofe.files import write_atomic
    from pofe.run.plan.common import PlanOptions, machine_gpus
    from pofe.run.plan.planner import plan_recipe
    from pofe.run.plan.render import render_text

    if output and not Path(output).resolve().parent.is_dir():
        # checked before planning, which reads every config.json: not a traceback after it
        raise click.BadParameter(
            f"the folder {Path(output).parent} does not exist: create it, or give a file in an existing folder",
            param_hint="--output",
        )

    def planned() -> dict:
        # this machine's GPUs are asked of torch, whose import may print: inside --json's redirect
        count, memory, gpus_from = machine_gpus(gpus, gpu_memory)
        options = PlanOptions(gpus=count, gpu_memory_gb=memory, device=device, gpus_from=gpus_from)
        return plan_recipe(config, options, prompts, command)

    if not as_json:
        result = planned()
        click.echo(render_text(result))
    else:
        with json_stdout() as out:
            result = planned()
            out.write(json.dumps(result, indent=2) + "\n")
    if output:
        write_atomic(Path(output), json.dumps(result, indent=2) + "\n")


@pofe.command(name="eval")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--no-report", is_flag=True, help="Write eval/ only (`axolotl pofe run` reports once, at its end).")
@click.option(
    "--model",
    default=None,
    help="A trained model to evaluate against CONFIG's base model (default: CONFIG's output_dir).",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False),
    default=None,
    help="Where a trained model's evaluation and report go (default: <model>/pofe-eval).",
)
@axolotl_overrides
def eval_(config: str, no_report: bool = False, model: str | None = None, output: str | None = None, **overrides):
    """Evaluate CONFIG's run, or one trained model, and report.

    An iterated run (`axolotl pofe run`): each round's trained model on its own prompts (the
    report's headline) and, with held-out prompts, every iterate on them (pofe.eval). A model
    trained by `axolotl train` on the recipe's own datasets (k-response rows, pairs), or
    --model: it (pi_1) and the base model (pi_0) answer held-out prompts (pofe.eval.prompts,
    pofe.eval.held_out, or the val_set_size split), judged by pofe.eval.judge or pofe.judge.
    axolotl's options (--base-model, ...) apply to the recipe, recorded with the evaluation.
    """
    from pofe.run.evaluation.evaluate import evaluate_run
    from pofe.run.guards import REPORT, holding_run
    from pofe.run.report import write_report

    folder = evaluate_run(config, echo=click.echo, model=model, output=output, overrides=overrides)
    if not no_report:
        with holding_run(folder, click.echo, REPORT):
            click.echo(write_report(folder).terminal_summary())


@pofe.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", default=None, help="The trained model an evaluation was of (as given to `pofe eval`).")
@click.option("--output", type=click.Path(file_okay=False), default=None, help="As given to `pofe eval`.")
@click.option("--output-dir", default=None, help="The run's output_dir, when given to `pofe run` on the command line.")
def report(config: str, model: str | None, output: str | None, output_dir: str | None):
    """(Re)write the report of CONFIG's run, or of a trained model's evaluation: report.md,
    report.json, report-*.png."""
    from pofe.run.evaluation.trained import check_reportable, report_folder
    from pofe.run.guards import REPORT, holding_run
    from pofe.run.report import write_report

    folder = report_folder(config, model, output, output_dir)
    with holding_run(folder, click.echo, REPORT):
        check_reportable(folder, config)
        click.echo(write_report(folder).terminal_summary())


@pofe.command()
@click.argument("names", nargs=-1)
@click.option(
    "--to",
    "destination",
    type=click.Path(file_okay=False, path_type=Path),
    default="recipes",
    show_default=True,
    help="Folder to copy into. The shipped recipes name their DeepSpeed config under recipes/ (relative to "
    "where a run starts); elsewhere the copy names the copied config.",
)
@click.option("--force", is_flag=True, help="Replace a file that differs from the shipped one.")
def recipes(names: tuple[str, ...], destination: Path, force: bool):
    """The recipes POFE ships: without NAMES, list them; with NAMES, copy each (and the
    DeepSpeed config it names) into --to, ready for `axolotl pofe run recipes/<name>.yml`."""
    from pofe.shipped_recipes import copy_recipe, shipped

    if not names:
        listed = shipped()
        width = max(len(r.name) for r in listed)
        for r in listed:
            click.echo(f"{r.name:<{width}}  {r.summary}" + (f" (+ {r.deepspeed})" if r.deepspeed else ""))
        click.echo(f"\n`axolotl pofe recipes NAME` copies one into {destination}/")
        return
    for name in names:
        for line in copy_recipe(name, destination, force):
            click.echo(f"wrote {line}")


if __name__ == "__main__":
    # `python -m pofe.cli plan recipe.yml --json`: POFE's commands without axolotl's CLI around them
    # (whose banner comes first on stdout)
    pofe(prog_name="python -m pofe.cli")
