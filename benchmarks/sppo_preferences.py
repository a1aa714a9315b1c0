"""SPPO on a verifier: Bradley-Terry at unit scale against hard preferences, two rounds each.

    python -m benchmarks.sppo_preferences                 # ~minutes on 2 CPU cores
    python -m benchmarks.sppo_preferences --seeds 0 1 2   # several seeds, a mean

Each variant runs `axolotl pofe run` on recipes/tiny-sppo-verifier-cpu.yml (the toy addition
task of `pofe.demo`, its computed reward as the judge), the same tiny model, prompts and seed,
differing only in `pofe.judge.preferences`:

  bradley_terry  P[i, j] = sigmoid(r_i - r_j) (T = 1): rewards in [0, 1] give P in 0.27-0.73
  hard           1 if r_i > r_j, 1/2 on a tie, 0 otherwise

and reports, from each run's report.json: the mean win-rate spread of each round's candidates
(max - min win rate per prompt, mean over prompts); the held-out mean reward of pi_0 (the
start) and of the last round's policy (`pofe.eval`, held-out prompts never trained on), whose
difference is the gain; and each round's policy's mean reward on the first 20 prompts it
trained on (`pofe.eval.train_prompts`), beside its candidates' mean there. Results go to
benchmarks/results/sppo_preferences.json (untracked, as the other results).
Not part of the test suite.

Measured (2 CPU cores shared, seeds 0 and 1, ~2 min per run):

    preferences     win-rate spread (round 1, 2)   held-out gain   training-prompt reward, round 2
    bradley_terry   0.233, 0.233                   0.000           0.0003 (candidates there: 0.146)
    hard            0.667, 0.671                   0.002           0.015  (candidates there: 0.147)

hard gives SPPO about 2.9x the spread; the 2-layer model learns almost nothing about held-out
additions in two rounds either way (its samples score about 0), so the reward figures only
say the direction.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "tiny-sppo-verifier-cpu.yml"
VARIANTS = ("bradley_terry", "hard")
# each round's policy is also scored on this many of the prompts it trained on: a 2-layer model
# memorises its training additions, while held-out ones stay out of its reach
TRAIN_PROMPTS_EVAL = 20


def run_variant(recipe: dict, work: Path, preferences: str) -> dict:
    """`axolotl pofe run` with judge.preferences set; the run's figures from its report.json."""
    cfg = json.loads(json.dumps(recipe))  # a deep copy
    cfg["pofe"]["judge"]["preferences"] = preferences
    cfg["pofe"]["eval"]["train_prompts"] = TRAIN_PROMPTS_EVAL
    cfg["dataset_prepared_path"] = str(work / f"prepared-{preferences}")
    cfg["output_dir"] = str(work / f"run-{preferences}")
    path = work / f"{preferences}.yml"
    path.write_text(yaml.safe_dump(cfg))
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
    subprocess.run(
        [str(bin_dir / "axolotl"), "pofe", "run", str(path), "--launcher", "python", "--quiet"],
        env=env,
        check=True,
        cwd=work,
    )
    seconds = time.perf_counter() - start
    report = json.loads((Path(cfg["output_dir"]) / "report.json").read_text())
    held_out = report["eval"]["mean_reward"]  # pi_0, pi_1, ..., per model
    return {
        "preferences": preferences,
        "win_rate_spread_per_round": [(r["candidates"] or {}).get("win_rate_spread") for r in report["rounds"]],
        "held_out_reward": held_out,
        "held_out_gain": held_out[-1] - held_out[0],
        # per round: (the trained policy's mean reward, its own candidates' mean) on its training prompts
        "train_prompts_reward_per_round": [
            [(r["trained_on_train_prompts"] or {}).get(k) for k in ("model_mean_reward", "candidates_mean_reward")]
            for r in report["rounds"]
        ],
        "seconds": round(seconds, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sppo_preferences.json")
    args = parser.parse_args(argv)

    from pofe.demo.stages import NEAR_MISSES, NUM_TRAIN_PROMPTS
    from pofe.demo.task import make_prompt_rows, write_jsonl
    from pofe.demo.tiny import build_tiny_model

    results = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="pofe-sppo-prefs-") as tmp:
            work = Path(tmp)
            recipe = yaml.safe_load(RECIPE.read_text())
            recipe["seed"] = seed
            recipe["base_model"] = str(work / "model")
            recipe["datasets"][0]["path"] = str(work / "prompts.jsonl")
            build_tiny_model(work / "model", seed=seed)
            write_jsonl(make_prompt_rows(NUM_TRAIN_PROMPTS, k_wrong=NEAR_MISSES, seed=seed), work / "prompts.jsonl")
            for preferences in VARIANTS:
                row = {"seed": seed, **run_variant(recipe, work, preferences)}
                print(json.dumps(row), flush=True)
                results.append(row)
    summary = {
        p: {
            "mean_held_out_gain": sum(r["held_out_gain"] for r in rs) / len(rs),
            "mean_win_rate_spread_round_1": sum(r["win_rate_spread_per_round"][0] for r in rs) / len(rs),
            "mean_train_prompts_reward_last_round": sum(r["train_prompts_reward_per_round"][-1][0] for r in rs)
            / len(rs),
        }
        for p in VARIANTS
        for rs in [[r for r in results if r["preferences"] == p]]
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"recipe": str(RECIPE.relative_to(ROOT)), "runs": results, "summary": summary}, indent=2) + "\n"
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
