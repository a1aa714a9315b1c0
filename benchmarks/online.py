"""Online RRHF against rounds of offline RRHF, at an equal number of sampled candidates.

    python -m benchmarks.online            # ~8 min on 2 cores
    python -m benchmarks.online --quick    # a smoke run: 2 epochs, three arms (~2 min)

On the demo's toy task (`python -m pofe.demo`: the tiny random Llama, 60 addition prompts with
their answer, the verifiable reward `pofe.demo.task:reward`), every arm samples
4 candidates per prompt for each of the 60 prompts once per epoch's worth of steps, E times:

online-r<N>-kl<c>  `axolotl train` on recipes/tiny-rrhf-online-cpu.yml, E epochs of 15 steps
                   (micro_batch_size 4), `pofe.online.refresh_every` N and `kl_coef` c: the policy
                   samples the next N steps' prompts every N steps, inside the one process
rounds             `axolotl pofe run` on recipes/tiny-rrhf-cpu.yml with `pofe.rounds` E, each
                   round one epoch (15 steps) on candidates sampled from the previous round's
                   model for all 60 prompts, `pofe.eval: false` (each round is an `axolotl
                   preprocess` and an `axolotl train` process)

Both sample, add the dataset's responses and judge as recipes/tiny-rrhf-online-cpu.yml does (its
`pofe.generate` and `pofe.judge`: the answer joins 4 samples; the rounds take these blocks over
the offline recipe's, which adds the near misses too). Both use a
constant learning rate (1e-3, no warm-up) where the recipes take a cosine schedule with 10
warm-up steps: a round restarts its schedule (and its optimizer) every 15 steps where the online
run's spans all E epochs, and the schedule would then be the difference measured.

Per arm: the wall time of the whole command (start-up included); the seconds spent generating and
judging (online: each refresh's `generate_seconds` + `judge_seconds` from its refresh.json under
output_dir/online/, and apart the `score_seconds` of the policy's and pi_0's log-probs; rounds:
the preprocess stages' seconds in pofe-run.json, whole `axolotl preprocess` processes, start-up
and tokenising included); the mean reward of the policy's own samples (dataset responses left out)
in the first and the last epoch (online: every refresh of the epoch pooled, so each figure covers
the same 60 prompts; rounds: the first and last round); and the trained model's greedy reward on
the 60 prompts (`pofe.demo.evaluate.greedy_reward`), beside the base model's. Sampling and
training are seeded, so only the times vary between repetitions; the arms' order rotates by one
each repetition.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.trainers import axolotl, environment

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
MICRO_BATCH = 4
# refresh_every: every step, a third of an epoch, an epoch (60 prompts / 4 = 15 steps)
REFRESH_EVERY, KL_COEFS = (1, 5, 15), (0.001, 0.0)


def arm_names(quick: bool) -> list[str]:
    """The arms, online and rounds interleaved so that neither kind runs all at once."""
    online = [(n, c) for n in ((1, 15) if quick else REFRESH_EVERY) for c in ((0.001,) if quick else KL_COEFS)]
    names = [f"online-r{n}-kl{c:g}" for n, c in online]
    names.insert(len(names) // 2, "rounds")
    return names


def recipe_for(arm: str, work: Path, epochs: int) -> dict:
    """The arm's recipe: the shipped one pointed at `work`, with the shared batch and schedule."""
    online = arm != "rounds"
    base = yaml.safe_load((RECIPES / ("tiny-rrhf-online-cpu.yml" if online else "tiny-rrhf-cpu.yml")).read_text())
    recipe = {
        **base,
        "base_model": str(work / "model"),
        "datasets": [{**base["datasets"][0], "path": str(work / "prompts.jsonl")}],
        "dataset_prepared_path": str(work / arm / "prepared"),
        "output_dir": str(work / arm / "out"),
        "micro_batch_size": MICRO_BATCH,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "num_epochs": epochs if online else 1,
    }
    pofe = dict(base["pofe"])
    if online:
        refresh, kl = arm.removeprefix("online-r").split("-kl")
        pofe["online"] = {**pofe["online"], "refresh_every": int(refresh), "kl_coef": float(kl)}
    else:
        # the candidates the online recipe samples and judges (its dataset responses): only how
        # often they are refreshed differs between the arms
        online_pofe = yaml.safe_load((RECIPES / "tiny-rrhf-online-cpu.yml").read_text())["pofe"]
        pofe.update(rounds=epochs, eval=False, generate=online_pofe["generate"], judge=online_pofe["judge"])
    recipe["pofe"] = pofe
    return recipe


def run_arm(arm: str, work: Path, epochs: int, steps_per_epoch: int) -> dict:
    """One whole command on a fresh output_dir: its wall time and what its files record."""
    shutil.rmtree(work / arm, ignore_errors=True)  # a first run: nothing prepared, nothing to resume
    path = work / arm / "recipe.yml"
    path.parent.mkdir(parents=True)
    recipe = recipe_for(arm, work, epochs)
    path.write_text(yaml.safe_dump(recipe))
    command = (
        axolotl("pofe", "run", str(path)) if arm == "rounds" else axolotl("train", str(path), "--launcher", "python")
    )
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=environment())
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{arm}: {' '.join(command)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    out = Path(recipe["output_dir"])
    facts = rounds_facts(out) if arm == "rounds" else online_facts(out, steps_per_epoch)
    return {"wall_seconds": wall, **facts}


def online_facts(out: Path, steps_per_epoch: int) -> dict:
    """An online run's refreshes: their summed seconds, and the policy's samples' mean reward in
    the first and the last epoch (every refresh of the epoch pooled)."""
    from pofe.files import read_jsonl
    from pofe.online.stats import window_stats

    refreshes = sorted((out / "online").glob("refresh-*"))
    seconds = {"generate": 0.0, "judge": 0.0, "score": 0.0}
    epochs: dict[int, tuple[list, list]] = {}
    for folder in refreshes:
        record = json.loads((folder / "refresh.json").read_text())
        for stage in seconds:
            seconds[stage] += record["stats"].get(f"{stage}_seconds", 0.0)
        generated, judged = epochs.setdefault(record["start_step"] // steps_per_epoch, ([], []))
        generated += read_jsonl(folder / "generate.jsonl")
        judged += read_jsonl(folder / "judge.jsonl")
    # window_stats' reward of the policy's own samples, over an epoch's rows (none kept aside)
    reward = {e: window_stats(g, j, {}, [])["candidate_reward_mean"] for e, (g, j) in epochs.items()}
    return {
        "refreshes": len(refreshes),
        "generate_judge_seconds": seconds["generate"] + seconds["judge"],
        "seconds": seconds,
        "prompts_sampled": sum(len(g) for g, _ in epochs.values()),
        "sample_reward_first": reward[min(reward)],
        "sample_reward_last": reward[max(reward)],
        "model": str(out),
    }


def rounds_facts(out: Path) -> dict:
    """An iterated run's stages from pofe-run.json, and its rounds' policy samples' mean reward."""
    from pofe.records.candidates import CandidatesSummary
    from pofe.run.folder import RunFolder

    folder = RunFolder(out)
    state = json.loads((out / "pofe-run.json").read_text())
    stages = {name: s["seconds"] for name, s in state["stages"].items()}
    rounds = sorted(int(r) for r in state["rounds"])
    reward = {
        t: CandidatesSummary.read(folder.summary(t), folder.rewrite_summary(t)).mean_policy_sample_reward
        for t in rounds
    }
    preprocess = sum(s for name, s in stages.items() if name.endswith("/preprocess"))
    return {
        "refreshes": len(rounds),
        "generate_judge_seconds": preprocess,
        "seconds": {"preprocess": preprocess, "train": sum(s for n, s in stages.items() if n.endswith("/train"))},
        "prompts_sampled": sum(len((out / "prompts" / f"round-{t}.jsonl").read_text().splitlines()) for t in rounds),
        "sample_reward_first": reward[rounds[0]],
        "sample_reward_last": reward[rounds[-1]],
        "model": state["final_policy"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=None, help="E: epochs online, rounds offline (default 10)")
    parser.add_argument("--reps", type=int, default=1, help="runs of each arm, the order rotating (default 1)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    epochs = args.epochs or (2 if args.quick else 10)
    out_path = Path(args.out or f"benchmarks/results/online-cpu{'-quick' if args.quick else ''}.json")

    from pofe.demo.evaluate import greedy_reward
    from pofe.demo.stages import prepare

    work = Path(tempfile.mkdtemp(prefix="pofe-online-"))
    rows = prepare({"base_model": str(work / "model"), "datasets": [{"path": str(work / "prompts.jsonl")}]}, seed=0)
    prompts = [r["prompt"] for r in rows]
    print(f"  runs in {work} (each arm's output_dir and logs)", flush=True)
    arms = arm_names(args.quick)
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for rep in range(args.reps):
        for arm in arms[rep % len(arms) :] + arms[: rep % len(arms)]:
            runs[arm].append(run_arm(arm, work, epochs, -(-len(prompts) // MICRO_BATCH)))
            print(f"  {arm}: {runs[arm][-1]['wall_seconds']:.0f} s", flush=True)
    before = greedy_reward(work / "model", prompts)["mean_reward"]
    summary = {arm: summarise(rs, greedy_reward(rs[-1]["model"], prompts)["mean_reward"]) for arm, rs in runs.items()}
    result = {
        "workload": {
            "prompts": len(prompts),
            "epochs": epochs,
            "micro_batch_size": MICRO_BATCH,
            "sampled_per_prompt": 4,
            "model": "the demo's Llama, 2 layers x 128",
            "threads": 1,
            "reps": args.reps,
        },
        "greedy_reward_before": before,
        "arms": summary,
        "runs": runs,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print_table(summary, before, epochs)
    return 0


def summarise(runs: list[dict], greedy_after: float) -> dict:
    """Median times over the repetitions; the rewards are the seeded runs' (alike in each)."""
    wall = statistics.median(r["wall_seconds"] for r in runs)
    generate_judge = statistics.median(r["generate_judge_seconds"] for r in runs)
    last = runs[-1]
    return {
        "wall_seconds": wall,
        "generate_judge_seconds": generate_judge,
        "generate_judge_share": generate_judge / wall,
        "score_seconds": statistics.median(r["seconds"].get("score", 0.0) for r in runs),
        "refreshes": last["refreshes"],
        "prompts_sampled": last["prompts_sampled"],
        "sample_reward_first": last["sample_reward_first"],
        "sample_reward_last": last["sample_reward_last"],
        "greedy_reward_after": greedy_after,
    }


def print_table(summary: dict, before: float, epochs: int) -> None:
    print(f"\n  {epochs} epochs of 60 prompts x 4 samples; greedy reward before training: {before:.3f}")
    print(f"  {'arm':18s} {'wall s':>7s} {'gen+judge s':>12s} {'share':>6s} {'score s':>8s} {'refreshes':>9s}", end="")
    print(f" {'samples first -> last':>22s} {'greedy after':>12s}")
    for arm, m in summary.items():
        print(
            f"  {arm:18s} {m['wall_seconds']:7.1f} {m['generate_judge_seconds']:12.1f} "
            f"{m['generate_judge_share']:6.1%} {m['score_seconds']:8.1f} {m['refreshes']:9d} "
            f"{m['sample_reward_first']:10.3f} -> {m['sample_reward_last']:.3f} {m['greedy_reward_after']:12.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())
