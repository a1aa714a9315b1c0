"""`python -m pofe.demo`: RRHF, SPPO or Nash-MD from prompts on a toy task, end to end on the CPU.

Builds a tiny random Llama and addition prompts ("12+7=") with a reference answer and
near misses, then runs the real `axolotl preprocess` (sample candidates from the tiny
model, add the dataset's responses, judge with the verifiable reward) and
`axolotl train` on the method's recipe (`recipes/tiny-rrhf-cpu.yml`,
`recipes/tiny-sppo-cpu.yml`). It greedy-decodes the prompts with the model before and
after training and prints the reward side by side with the candidates' mean and best-of-k
reward. `make demo` runs both methods, then both online (`--online`: the recipes
`recipes/tiny-<method>-online-cpu.yml`, whose candidates are sampled from the policy as it
trains inside `axolotl train`; the table then shows the policy's samples' reward at the first
and the last refresh), and Nash-MD, which trains online only (`--method nash_md --online`,
`recipes/tiny-nash-md-online-cpu.yml`: each sample judged against one of the mixture of the
policy and the base model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pofe.demo.evaluate import greedy_reward
from pofe.demo.task import make_prompt_rows, make_prompts, write_jsonl
from pofe.demo.tiny import build_tiny_model
from pofe.methods import method_spec
from pofe.online.refresh import FOLDER, read_refresh

NUM_TRAIN_PROMPTS = 60
NUM_HELD_OUT = 40
NEAR_MISSES = 3
METHODS = ("rrhf", "sppo", "nash_md")


def prepare(recipe: dict, seed: int) -> list[dict]:
    """Write the tiny model and the prompt rows where the recipe expects them."""
    build_tiny_model(Path(recipe["base_model"]), seed=seed)
    rows = make_prompt_rows(NUM_TRAIN_PROMPTS, k_wrong=NEAR_MISSES, seed=seed)
    write_jsonl(rows, Path(recipe["datasets"][0]["path"]))
    return rows


def axolotl(command: str, recipe_path: Path) -> float:
    """Run `axolotl <command> recipe` as a user would; returns its wall time."""
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "AXOLOTL_DO_NOT_TRACK": "1",
        "WANDB_MODE": "disabled",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    start = time.perf_counter()
    cmd = [str(bin_dir / "axolotl"), command, str(recipe_path)]
    if command == "train":
        cmd += ["--launcher", "python"]
    print(f"$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - start


def candidates_summary(recipe: dict, method: str) -> dict:
    """The summary.json of the candidates this run built: the newest of the method's under the
    recipe's dataset_prepared_path (the two tiny recipes share one; each method has its folders)."""
    found = [
        (path.stat().st_mtime, summary)
        for path in Path(recipe["dataset_prepared_path"]).glob("pofe-candidates-*/summary.json")
        if (summary := json.loads(path.read_text()))["method"] == method
    ]
    return max(found, key=lambda pair: pair[0])[1]


def print_table(method: str, summary: dict, seconds: float, before: dict, after: dict) -> None:
    """The before/after table: greedy reward and exact match on the training prompts, greedy
    reward on held-out ones, and the candidates' mean and best-of-k reward."""
    kept = summary["candidates_per_prompt"]["mean"]
    judged = sum(summary["candidates_by_source"].values()) / summary["rows"]
    trained = f", {kept:.1f} trained on" if f"{kept:.1f}" != f"{judged:.1f}" else ""
    print(
        f"\n{method.upper()} on {summary['rows']} addition prompts, {judged:.1f} candidates per prompt "
        f"(sampled + dataset){trained}, preprocess + train took {seconds:.0f} s\n"
    )
    print_greedy(before, after)
    print(f"{'candidates: mean reward':34}{summary['mean_candidate_reward']:>10.3f}")
    print(f"{'candidates: best-of-k (ceiling)':34}{summary['mean_best_of_k_reward']:>10.3f}")
    print_samples(before, after)


def print_online_table(method: str, refreshes: list[dict], seconds: float, before: dict, after: dict) -> None:
    """The online run's table: greedy rewards as offline, and the policy's own samples' mean and
    best-of-k reward at the first and the last refresh (each refresh's `refresh.json` stats)."""
    first, last = refreshes[0], refreshes[-1]
    print(
        f"\nONLINE {method.upper()} on {int(first['prompts'])} addition prompts, {len(refreshes)} refreshes "
        f"of the candidates from the policy as it trained, train took {seconds:.0f} s\n"
    )
    print_greedy(before, after)
    print(f"{'':34}{'refresh 1':>11}{f'refresh {len(refreshes)}':>11}")
    for name, key in (
        ("policy samples: mean reward", "candidate_reward_mean"),
        ("policy samples: best-of-k", "candidate_reward_best"),
        ("preference over the mixture", "preference"),  # a method that plays the mixture (Nash-MD)
    ):
        if key in first:
            print(f"{name:34}{first[key]:>11.3f}{last[key]:>11.3f}")
    print_samples(before, after)


def online_refreshes(recipe: dict) -> list[dict]:
    """Each refresh's stats, in step order, from the run's output_dir (`pofe.online.refresh`)."""
    folders = sorted((Path(recipe["output_dir"]) / FOLDER).glob("refresh-*"))
    return [read_refresh(folder)[2] for folder in folders]


def print_greedy(before: dict, after: dict) -> None:
    train, held = (before["train"], after["train"]), (before["held_out"], after["held_out"])
    print(f"{'':34}{'before':>10}{'after':>10}")
    print(f"{'greedy reward, training prompts':34}{train[0]['mean_reward']:>10.3f}{train[1]['mean_reward']:>10.3f}")
    print(f"{'exact match, training prompts':34}{train[0]['exact_match']:>10.3f}{train[1]['exact_match']:>10.3f}")
    print(f"{'greedy reward, held-out prompts':34}{held[0]['mean_reward']:>10.3f}{held[1]['mean_reward']:>10.3f}")


def print_samples(before: dict, after: dict) -> None:
    print("\nsamples (prompt -> before | after):")
    for (p, b, _), (_, a, r) in list(zip(before["train"]["samples"], after["train"]["samples"]))[:6]:
        print(f"  {p:<7} -> {b!r:<12} | {a!r:<8} reward {r:.2f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pofe.demo",
        description="Train a tiny random model with RRHF or SPPO on addition prompts (12+7=), on the CPU, "
        "through the real `axolotl preprocess` and `axolotl train`, and print its greedy reward before "
        "and after beside the candidates' mean and best-of-k reward.",
    )
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="rrhf",
        help="rrhf (default): rank the candidates by their reward; sppo: regress on their win rates "
        "(a verifier's sharp comparisons); nash_md (with --online): a policy gradient on each sample's "
        "preference over a sample of the mixture of the policy and the base model. Picks the recipe "
        "recipes/tiny-<method>[-online]-cpu.yml (nash_md: tiny-nash-md-online-cpu.yml).",
    )
    parser.add_argument(
        "--online",
        action="store_true",
        help="Train online (recipes/tiny-<method>-online-cpu.yml): the candidates are sampled from the policy "
        "as it trains, every pofe.online.refresh_every steps, inside one `axolotl train`.",
    )
    parser.add_argument(
        "--recipe",
        type=Path,
        default=None,
        help="A recipe of your own in place of the method's (its base_model, datasets[0].path and "
        "dataset_prepared_path are where the demo writes and reads); its `rl:` is the method.",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="Seed of the tiny model's weights and of the prompts (default 0); training keeps the recipe's.",
    )
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="Write the tiny model and the prompts where the recipe expects them, and stop: then run "
        "`axolotl preprocess` and `axolotl train` on the recipe yourself.",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.recipe is None and method_spec(args.method).trains_online_only and not args.online:
        raise SystemExit(f"python -m pofe.demo: --method {args.method} trains online only: add --online")
    name = args.method.replace("_", "-")
    recipe_path = args.recipe or Path("recipes") / f"tiny-{name}{'-online' if args.online else ''}-cpu.yml"
    recipe = yaml.safe_load(recipe_path.read_text())
    rows = prepare(recipe, args.seed)
    print(f"wrote a tiny model to {recipe['base_model']} and {len(rows)} prompts")
    if args.prepare_only:
        return
    method = recipe["rl"]
    prompts = {"train": [r["prompt"] for r in rows]}
    # operands are drawn without replacement, so the tail of a longer list is unseen
    tail = make_prompts(NUM_TRAIN_PROMPTS + NUM_HELD_OUT, seed=args.seed)[NUM_TRAIN_PROMPTS:]
    prompts["held_out"] = [p for p in tail if p not in set(prompts["train"])]
    before = {name: greedy_reward(recipe["base_model"], p) for name, p in prompts.items()}
    online = "online" in (recipe.get("pofe") or {})
    # online, the candidates are sampled inside `axolotl train`: nothing to preprocess
    seconds = (0.0 if online else axolotl("preprocess", recipe_path)) + axolotl("train", recipe_path)
    after = {name: greedy_reward(recipe["output_dir"], p) for name, p in prompts.items()}
    if online:
        print_online_table(method, online_refreshes(recipe), seconds, before, after)
        return
    print_table(method, candidates_summary(recipe, method), seconds, before, after)
    print(
        "\nThe tiny model learns the training prompts; held-out additions stay hard for a 2-layer, "
        "128-wide model. Best-of-k is the ceiling RRHF converges to; SPPO moves each candidate's "
        "log-probability by its win rate, so its greedy answer rises towards the candidates' best."
    )


if __name__ == "__main__":
    main()
