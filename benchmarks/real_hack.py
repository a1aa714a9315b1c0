"""A judge with a blind spot, hacked and held, on a real model: online RRHF (LoRA) on
SmolLM2-135M-Instruct (`python -m pofe.demo --prepare-real`) against `pofe.demo.real_task:
verbose_reward` (the verifier plus 0.05 a character after the last integer), once with `kl_coef: 0`
and once with `pofe.demo.real_hack.HACK_KL`, the online monitors on at every refresh.

    python -m benchmarks.real_hack --seed 0     # two `axolotl train` runs, one after the other

Each run (`pofe.demo.real_hack.hack_recipe`): 32 two-digit additions asked in words, a refresh a
step of 8 prompts, 4 samples each (temperature 1, up to 24 tokens), 3 epochs (12 refreshes), LoRA r 16
from the model itself as pi_0. The table, per refresh: the judge's mean reward of the samples
(`online/candidate_reward_mean`), the verifier's (`pofe.eval.judge2`: `online/judge2_reward_mean`),
the policy's perplexity of the 32 held-out questions' bare sums (`online/reference_perplexity`),
the samples' mean log-ratio to pi_0 (`online/kl_to_pi_0`) and their mean length in tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from pofe.demo.real_hack import HACK, HACK_KL, hack_curves, hack_recipe, hack_table
from pofe.demo.stages import ENV
from pofe.run.rounds.processes import axolotl_command

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_hack", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kl", type=float, nargs="+", default=[0.0, HACK_KL], help="kl_coef of each run")
    parser.add_argument("--epochs", type=int, default=HACK.epochs)
    parser.add_argument("--lr", type=float, default=HACK.learning_rate)
    parser.add_argument("--temperature", type=float, default=1.0, help="the samples' (1: real_recipe's)")
    parser.add_argument("--model", type=Path, default=ROOT / ".real-model" / "SmolLM2-135M-Instruct")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    size = replace(HACK, epochs=args.epochs, learning_rate=args.lr)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"real-hack-seed{args.seed}-"))
    curves, seconds = {}, {}
    for kl in args.kl:
        run = work / f"kl{kl:g}"
        cfg = run / "recipe.yml"
        run.mkdir(parents=True, exist_ok=True)
        recipe = hack_recipe(args.model, run, size, args.seed, kl)
        recipe["pofe"]["generate"]["temperature"] = args.temperature
        cfg.write_text(yaml.safe_dump(recipe))
        start = time.monotonic()
        with open(run / "train.log", "w") as log:
            subprocess.run(
                [*axolotl_command("train", str(cfg)), "--launcher", "python"],
                env={**os.environ, **ENV},
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )
        seconds[kl] = time.monotonic() - start
        curves[kl] = hack_curves(run / "out")
        print(f"kl_coef {kl:g}: {seconds[kl]:.0f} s, log {run / 'train.log'}", flush=True)
    print("\n".join(hack_table(curves)))
    result = {
        "seed": args.seed,
        "size": {"epochs": size.epochs, "learning_rate": size.learning_rate, "temperature": args.temperature},
        "runs": [{"kl_coef": kl, "seconds": seconds[kl], "refreshes": curves[kl]} for kl in args.kl],
        "work": str(work),
    }
    # named by the kl_coefs too: a run of other coefficients for the same seed keeps the first's figures
    kls = "-".join(f"{kl:g}" for kl in args.kl)
    cooler = "" if args.temperature == 1.0 else f"-t{args.temperature:g}"
    out = ROOT / "benchmarks" / "results" / f"real-hack-seed{args.seed}-kl{kls}{cooler}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
