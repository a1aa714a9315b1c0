"""A real instruct model improved by each method on the CPU: SmolLM2-135M-Instruct (`python -m
pofe.demo --prepare-real`) on two-digit additions asked in words (`pofe.demo.real_task`), at the
benchmark's size: more prompts and steps than `python -m pofe.demo --real`, the same stages.

    python -m benchmarks.real_model --method rrhf --seed 0     # ~10 min on 2 cores
    python -m benchmarks.real_model --method sppo --seed 1
    python -m benchmarks.real_model --method nash_md --seed 2

Per run (`pofe.demo.real`): `axolotl preprocess` samples 4 answers per training prompt from the
model (temperature 1, transformers), adds the dataset's answer for RRHF (as the RRHF paper adds a
dataset's responses), and the verifier judges them (1 when the last integer is the sum); `axolotl
train` trains a LoRA adapter (r 16 on every linear layer). Then the model before and the adapter
after answer the held-out prompts greedily; the result gives each one's accuracy and the gain with
its 95 % interval, a paired bootstrap over held-out prompts (`pofe.run.evaluation.statistics`,
1,000 draws).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from pofe.demo.real import BENCHMARK, Answers, RealDemo

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=("rrhf", "sppo", "nash_md"), default="rrhf")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=BENCHMARK.prompts, help="training prompts")
    parser.add_argument("--held-out", type=int, default=Answers.held_out)
    parser.add_argument("--epochs", type=int, default=BENCHMARK.epochs)
    parser.add_argument("--lr", type=float, default=BENCHMARK.learning_rate)
    parser.add_argument("--model", type=Path, default=ROOT / ".real-model" / "SmolLM2-135M-Instruct")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    training = {args.method: replace(BENCHMARK, prompts=args.train, epochs=args.epochs, learning_rate=args.lr)}
    # the figures in benchmarks/README.md read answers of up to 32 tokens
    answers = Answers(held_out=args.held_out, tokens=32)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"real-{args.method}-"))
    demo = RealDemo(work, args.model, training, args.seed, answers, echo=print, stream=False, progress=None)
    (run,) = demo.run()["runs"]
    result = {
        "method": args.method,
        "seed": args.seed,
        "train_prompts": args.train,
        "held_out": args.held_out,
        **{key: run[key] for key in ("before", "after", "gain", "gain_95", "seconds")},
        "work": str(work),
    }
    out = ROOT / "benchmarks" / "results" / f"real-model-{args.method}-seed{args.seed}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
