"""POFE against the trainer a user would pick instead: whole `axolotl train` processes, side by side.

    python -m benchmarks.trainers            # ~12 min on 2 cores
    python -m benchmarks.trainers --quick    # a smoke run: 2 steps, one repetition
    python -m benchmarks.trainers --model .real-model/SmolLM2-135M-Instruct   # the real model, LoRA (~15 min)

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

`--model PATH` (a model folder with its tokenizer and chat template, e.g. the real SmolLM2-135M-
Instruct): the rows are `pofe.demo.real_task` questions with 4 plausible answers (the right sum
first, in the model's own "23 + 45 = 68" form, then wrong ones; rewards from the task's verifier),
every recipe trains a LoRA adapter as `benchmarks.real_model` does (r 16 on every linear layer,
its CPU settings), and the k-response comparison adds `axolotl_sft_k`: axolotl SFT on the same
tokens as RRHF's step, each of a row's 4 answers a row of its own (micro_batch_size 16: the 4
prompts x 4 answers that one RRHF step scores).
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


def toy_rows(rows: int, seed: int = 0) -> list[tuple[str, list[str], list[float]]]:
    """(prompt, k responses, rewards) of random characters; the first response is the best."""
    rng = random.Random(seed)
    return [
        (text(rng, PROMPT_CHARS), [text(rng, RESPONSE_CHARS) for _ in range(K)], [float(i) for i in range(K, 0, -1)])
        for _ in range(rows)
    ]


def real_rows(rows: int, seed: int = 0) -> list[tuple[str, list[str], list[float]]]:
    """(question, k answers, the verifier's rewards): `pofe.demo.real_task` questions, answered
    right in the model's own form first, then wrong in the forms it also gives."""
    from pofe.demo import real_task

    out = []
    for row in real_task.make_prompt_rows(rows, seed=seed):
        a, b = re.findall(r"\d+", row["prompt"])
        total = int(a) + int(b)
        answers = [f"{a} + {b} = {total}", f"{a} + {b} = {total + 10}", f"{total - 1}", f"{a}+{b} is {total + 1}."]
        out.append((row["prompt"], answers, [real_task.reward(row["prompt"], r) for r in answers]))
    return out


def write_data(work: Path, data: list[tuple[str, list[str], list[float]]]) -> dict[str, Path]:
    """The prompts with their k responses and rewards, in the trainers' formats."""
    files = {name: work / f"{name}.jsonl" for name in ("dpo", "pofe_pairs", "sft", "sft_k", "rrhf")}
    out = {name: [] for name in files}
    for question, responses, rewards in data:
        prompt = [{"role": "user", "content": question}]
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
        out["sft_k"] += [{"messages": [*prompt, {"role": "assistant", "content": r}]} for r in responses]
        out["rrhf"].append({"prompt": prompt, "responses": responses, "rewards": rewards})
    for name, path in files.items():
        path.write_text("".join(json.dumps(r) + "\n" for r in out[name]))
    return files


def recipes(work: Path, model: Path, files: dict[str, Path], steps: int, lora: bool = False) -> dict[str, Path]:
    """The recipes: the same model, sequence length, batch, steps and optimizer (and LoRA adapter)."""
    common = {
        "base_model": str(model),
        "sequence_len": 256 if lora else 1024,
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
    if lora:  # as benchmarks.real_model trains the real model
        from benchmarks.real_model import CPU

        common.update(CPU, adapter="lora", lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_target_linear=True)
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
        "axolotl_sft_k": {
            "datasets": [{**_entry(files["sft_k"], "chat_template"), "field_messages": "messages"}],
            "micro_batch_size": 4 * K,
        },
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
    anchor = float(ANCHOR.search(log).group(1)) if ANCHOR.search(log) else None
    runtime = float(RUNTIME.search(log).group(1))  # SPPO's anchor pass included
    return {
        "seconds_per_step": runtime / steps,
        "peak_rss_gib": int(PEAK.search(log).group(1)) / 2**20,
        "anchor_seconds": anchor,
        "seconds_per_step_after_anchor": None if anchor is None else (runtime - anchor) / steps,
    }


# what each comparison divides: the baseline's step time over POFE's
COMPARISONS = {"pairs": ("axolotl_dpo", "pofe_sppo"), "k_response": ("axolotl_sft", "pofe_rrhf")}
SAME_TOKENS = {"k_response_same_tokens": ("axolotl_sft_k", "pofe_rrhf")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None, help="runs of each variant, alternating (default 2)")
    parser.add_argument(
        "--model", type=Path, default=None, help="a model folder (its tokenizer): LoRA on real_task rows"
    )
    parser.add_argument("--steps", type=int, default=None, help="default 24 (--model: 8; --quick: 2)")
    parser.add_argument("--out", default=None, help="default benchmarks/results/trainers-cpu.json (--model: -real-)")
    args = parser.parse_args(argv)
    steps = args.steps or (2 if args.quick else 8 if args.model else 24)
    reps = 1 if args.quick else args.reps or 2
    # the toy: 128 rows, 96 trained on; a real model: one epoch, so SPPO's anchor pass scores what trains
    rows = 4 * steps if args.model or args.quick else 128

    work = Path(tempfile.mkdtemp(prefix="pofe-trainers-"))
    if args.model is None:
        from pofe.demo.tiny import build_tiny_model

        model = build_tiny_model(work / "model", hidden_size=HIDDEN, num_layers=LAYERS)
        data, comparisons = toy_rows(rows), COMPARISONS
    else:
        # the k-response baseline on the same tokens as RRHF's step (SFT on the best alone is the toy's)
        model, data, comparisons = (
            args.model.resolve(),
            real_rows(rows),
            {"pairs": COMPARISONS["pairs"], **SAME_TOKENS},
        )
    paths = recipes(work, model, write_data(work, data), steps, lora=args.model is not None)
    names = list(dict.fromkeys(n for pair in comparisons.values() for n in pair))
    for name in names:  # tokenised before any timing
        subprocess.run(axolotl("preprocess", str(paths[name])), check=True, capture_output=True, env=environment())
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(reps):  # the order flips each repetition
        for name in names[:: 1 if rep % 2 == 0 else -1]:
            runs[name].append(train(paths[name], steps))
    med = {name: {k: _median([r[k] for r in rs]) for k in rs[0]} for name, rs in runs.items()}
    out = {
        "workload": workload(args.model, model, data, rows, steps, reps),
        "median": med,
        "step_time_baseline_over_pofe": {},
        "runs": runs,
        "load_average_at_end": os.getloadavg(),
    }
    for key, (base, pofe) in comparisons.items():
        each = [b["seconds_per_step"] / p["seconds_per_step"] for b, p in zip(runs[base], runs[pofe])]
        ratio = med[base]["seconds_per_step"] / med[pofe]["seconds_per_step"]
        out["step_time_baseline_over_pofe"][key] = {"median": ratio, "min": min(each), "max": max(each), "each": each}
    sppo = med["pofe_sppo"]
    out["pofe_sppo_anchor_share"] = sppo["anchor_seconds"] / (steps * sppo["seconds_per_step"])  # of its runtime
    out_path = Path(args.out or f"benchmarks/results/trainers-{'real-' if args.model else ''}cpu.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    for name, m in med.items():
        anchor = f", anchor pass {m['anchor_seconds']:.1f} s" if m["anchor_seconds"] is not None else ""
        anchor += f" ({m['seconds_per_step_after_anchor']:.3f} s/step after it)" if anchor else ""
        print(f"  {name:13s} {m['seconds_per_step']:.3f} s/step, peak {m['peak_rss_gib']:.2f} GiB{anchor}")
    for key, (base, pofe) in comparisons.items():
        r = out["step_time_baseline_over_pofe"][key]
        print(f"  step time, {base} / {pofe}: {r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})")
    print(f"  POFE SPPO's anchor pass: {out['pofe_sppo_anchor_share']:.1%} of its training runtime")
    return 0


def workload(real: Path | None, model: Path, data: list, rows: int, steps: int, reps: int) -> dict:
    """What was trained: rows, k, steps, the model; for a real model its token counts (chat template)."""
    out = {"rows": rows, "k": K, "steps": steps, "micro_batch_size": 4, "threads": 1, "reps": reps}
    if real is None:
        return {
            **out,
            "prompt_chars": PROMPT_CHARS,
            "response_chars": RESPONSE_CHARS,
            "model": f"Llama {LAYERS} x {HIDDEN}",
        }
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))

    def tokens(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    chat = [[{"role": "user", "content": q}] for q, _, _ in data]
    lengths = [tokens(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)) for m in chat]
    answers = [tokens(r) for _, rs, _ in data for r in rs]
    return {
        **out,
        "model": str(model),
        "adapter": "lora r 16, every linear layer",
        "prompt_tokens_mean": statistics.mean(lengths),
        "answer_tokens_mean": statistics.mean(answers),
    }


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


if __name__ == "__main__":
    sys.exit(main())
