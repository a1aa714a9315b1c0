"""POFE against the trainer a user would pick instead: whole `axolotl train` processes, side by side.

    python -m benchmarks.trainers            # ~12 min on 2 cores
    python -m benchmarks.trainers --quick    # a smoke run: 2 steps, one repetition

Two comparisons, each on one dataset written in the two trainers' formats:

pairs      axolotl's own `rl: dpo` with `dpo_loss_type: [sppo_hard]` (TRL's DPOTrainer: chosen and
           rejected rows concatenated, and a live reference model) against POFE's `rl: sppo` with
           `pofe.sppo_loss: hard` (prompt shared, the anchor's log-probs computed once before the
           first step), on the same chosen/rejected pairs
k-response axolotl SFT on each prompt's best response (`type: chat_template`) against POFE's
           `rl: rrhf` on the same rows with all k responses and their rewards

Each run is a fresh `axolotl train` process (`--launcher python`, one thread) on a dataset prepared
beforehand by `axolotl preprocess`, so start-up holds no tokenising. Per run: the step time after
start-up (the Trainer's own `train_runtime` over the steps), the process's peak resident memory
(its rusage), and for POFE's SPPO the anchor pass's seconds (its log line): the pass runs inside
the Trainer's runtime, before the first step, and its cached table is deleted before each run, so
every run pays it as a first training does. The two variants of a comparison alternate run by
run; figures are medians and ratios, never absolute claims: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

# a 6-layer 512-wide Llama (the tiny char-level tokenizer: one token per character)
HIDDEN, LAYERS = 512, 6
PROMPT_CHARS, RESPONSE_CHARS, K = 300, 120, 4
# the Trainer's summary line, POFE's anchor log line, this script's wrapper's peak
RUNTIME = re.compile(r"'train_runtime': '?([\d.]+)")
ANCHOR = re.compile(r"POFE: computed SPPO anchor log-probs for \d+ rows in ([\d.]+) s")
PEAK = re.compile(r"PEAK_RSS_KB (\d+)")
# runs the command and reports the largest resident set of what it ran (`axolotl train` in process)
WRAPPER = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)"
)


def text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + "     ") for _ in range(n)).strip() or "a"


def write_data(work: Path, rows: int, seed: int = 0) -> dict[str, Path]:
    """One set of prompts and k responses with rewards, in the four trainers' formats."""
    rng = random.Random(seed)
    files = {name: work / f"{name}.jsonl" for name in ("dpo", "pofe_pairs", "sft", "rrhf")}
    out = {name: [] for name in files}
    for _ in range(rows):
        prompt = [{"role": "user", "content": text(rng, PROMPT_CHARS)}]
        responses = [text(rng, RESPONSE_CHARS) for _ in range(K)]
        rewards = [float(i) for i in range(K, 0, -1)]  # the first response is the best
        chosen, rejected = responses[0], responses[-1]
        out["dpo"].append(
            {
                "messages": prompt,
                "chosen": {"role": "assistant", "content": chosen},
                "rejected": {"role": "assistant", "content": rejected},
            }
        )
        out["pofe_pairs"].append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        out["sft"].append({"messages": [*prompt, {"role": "assistant", "content": chosen}]})
        out["rrhf"].append({"prompt": prompt, "responses": responses, "rewards": rewards})
    for name, path in files.items():
        path.write_text("".join(json.dumps(r) + "\n" for r in out[name]))
    return files


def recipes(work: Path, model: Path, files: dict[str, Path], steps: int) -> dict[str, Path]:
    """The four recipes: the same model, sequence length, batch, steps and optimizer."""
    common = {
        "base_model": str(model),
        "sequence_len": 1024,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": 1e-5,
        "lr_scheduler": "constant",
        "optimizer": "adamw_torch",
        "save_strategy": "no",
        "logging_steps": 1,
        "seed": 0,
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "attn_implementation": "sdpa",
        "sample_packing": False,
        "dataloader_num_workers": 0,
    }
    variants = {
        "axolotl_dpo": {
            "rl": "dpo",
            "dpo_loss_type": ["sppo_hard"],
            "datasets": [_entry(files["dpo"], "chat_template.default")],
        },
        "pofe_sppo": {
            "plugins": ["pofe.PofePlugin"],
            "rl": "sppo",
            "pofe": {"sppo_loss": "hard"},
            "datasets": [_entry(files["pofe_pairs"], "pofe.pairs")],
        },
        "axolotl_sft": {"datasets": [{**_entry(files["sft"], "chat_template"), "field_messages": "messages"}]},
        "pofe_rrhf": {"plugins": ["pofe.PofePlugin"], "rl": "rrhf", "datasets": [_entry(files["rrhf"], "pofe.rrhf")]},
    }
    paths = {}
    for name, extra in variants.items():
        recipe = {
            **common,
            **extra,
            "dataset_prepared_path": str(work / name / "prepared"),
            "output_dir": str(work / name / "out"),
        }
        paths[name] = work / f"{name}.yml"
        paths[name].write_text(yaml.safe_dump(recipe))
    return paths


def _entry(path: Path, kind: str) -> dict:
    return {"path": str(path), "type": kind, "split": "train"}


def axolotl(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "axolotl"), *args]


def environment() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    env.update(HF_DATASETS_OFFLINE="1", AXOLOTL_DO_NOT_TRACK="1", WANDB_MODE="disabled")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def train(recipe: Path, steps: int) -> dict:
    """One `axolotl train` process: seconds per step after start-up, peak resident GiB, anchor seconds."""
    prepared = Path(yaml.safe_load(recipe.read_text())["dataset_prepared_path"])
    for table in prepared.glob("pofe-anchor-*.pt"):  # every run scores its anchor, as a first run does
        table.unlink()
    command = [sys.executable, "-c", WRAPPER, *axolotl("train", str(recipe), "--launcher", "python")]
    proc = subprocess.run(command, capture_output=True, text=True, env=environment())
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{recipe.name}: axolotl train exited {proc.returncode}:\n{log[-3000:]}")
    anchor = ANCHOR.search(log)
    return {
        "seconds_per_step": float(RUNTIME.search(log).group(1)) / steps,
        "peak_rss_gib": int(PEAK.search(log).group(1)) / 2**20,
        "anchor_seconds": float(anchor.group(1)) if anchor else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None, help="runs of each variant, alternating (default 2)")
    parser.add_argument("--out", default="benchmarks/results/trainers-cpu.json")
    args = parser.parse_args(argv)
    steps, rows, reps = (2, 8, 1) if args.quick else (24, 128, args.reps or 2)

    from pofe.demo.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="pofe-trainers-"))
    model = build_tiny_model(work / "model", hidden_size=HIDDEN, num_layers=LAYERS)
    paths = recipes(work, model, write_data(work, rows), steps)
    for recipe in paths.values():  # tokenised before any timing
        subprocess.run(axolotl("preprocess", str(recipe)), check=True, capture_output=True, env=environment())
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    for _ in range(reps):
        for baseline, pofe in (("axolotl_dpo", "pofe_sppo"), ("axolotl_sft", "pofe_rrhf")):
            runs[baseline].append(train(paths[baseline], steps))
            runs[pofe].append(train(paths[pofe], steps))
    med = {name: {k: _median([r[k] for r in rs]) for k in rs[0]} for name, rs in runs.items()}
    out = {
        "workload": {
            "rows": rows,
            "prompt_chars": PROMPT_CHARS,
            "response_chars": RESPONSE_CHARS,
            "k": K,
            "steps": steps,
            "micro_batch_size": 4,
            "model": f"Llama {LAYERS} layers x {HIDDEN}",
            "threads": 1,
            "reps": reps,
        },
        "median": med,
        "step_time_baseline_over_pofe": {
            "pairs": med["axolotl_dpo"]["seconds_per_step"] / med["pofe_sppo"]["seconds_per_step"],
            "k_response": med["axolotl_sft"]["seconds_per_step"] / med["pofe_rrhf"]["seconds_per_step"],
        },
        "runs": runs,
    }
    sppo = med["pofe_sppo"]
    out["pofe_sppo_anchor_share"] = sppo["anchor_seconds"] / (
        sppo["anchor_seconds"] + steps * sppo["seconds_per_step"]
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for name, m in med.items():
        anchor = f", anchor pass {m['anchor_seconds']:.1f} s" if m["anchor_seconds"] is not None else ""
        print(f"  {name:12s} {m['seconds_per_step']:.3f} s/step, peak {m['peak_rss_gib']:.2f} GiB{anchor}")
    ratios = out["step_time_baseline_over_pofe"]
    print(f"  step time, axolotl DPO (sppo_hard) / POFE SPPO hard: {ratios['pairs']:.2f}x")
    print(f"  step time, axolotl SFT on the best / POFE RRHF (k={K}): {ratios['k_response']:.2f}x")
    print(f"  POFE SPPO's anchor pass: {out['pofe_sppo_anchor_share']:.1%} of its anchor + training time")
    return 0


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


if __name__ == "__main__":
    sys.exit(main())
