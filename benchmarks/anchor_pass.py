"""SPPO's anchor pass against one training epoch's forward passes, and what sorting its
batches by length saves.

    python -m benchmarks.anchor_pass [--rows 128] [--reps 3]

A tiny Llama (hidden 128, 2 layers, random weights), `rows` synthetic rows of k = 4
responses whose lengths are log-normal (prompt median 48 tokens, responses median 64, sigma
0.8: some several times the median), batches of 4, prefix sharing (packed rows). Variants,
interleaved (medians):

  anchor_sorted    `AnchorLogps.compute`: one no-grad pass, eval mode, longest rows first
  anchor_unsorted  the same pass in dataset order (`sort_by_length=False`)
  epoch_forward    one epoch's training forwards: train mode, gradients recorded, batches
                   in a shuffled order as the trainer's sampler draws them (no backward)

Seconds are CPU seconds of this process on the CPU, wall clock on CUDA (benchmarks/judges.py's
`clock`). Prints the ratios and how far the sorted table is from the unsorted one.
Writes benchmarks/results/anchor-pass-<device>.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.anchor_ranks import stand_in_trainer
from benchmarks.judges import interleaved, timed, write_result


def varied_rows(rows: int, k: int, seed: int = 0):
    from datasets import Dataset

    rng = random.Random(seed)
    length = lambda median: min(512, max(1, round(rng.lognormvariate(0, 0.8) * median)))  # noqa: E731
    ids = lambda n: [rng.randrange(7, 100) for _ in range(n)]  # noqa: E731
    responses = [[ids(length(64)) for _ in range(k)] for _ in range(rows)]
    return Dataset.from_dict(
        {
            "row_id": list(range(rows)),
            "prompt_ids": [ids(length(48)) for _ in range(rows)],
            "response_ids": responses,
            "win_rates": [[0.5] * k] * rows,
        }
    )


def epoch_forward(model, trainer, batch_size: int, seed: int = 0) -> None:
    """One epoch of training forwards (train mode, autograd recording, no backward)."""
    data = trainer.train_dataset
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    model.train()
    for start in range(0, len(order), batch_size):
        batch = trainer.data_collator(list(data.select(order[start : start + batch_size])))
        trainer.score_candidates(model, {k: v.to(model.device) for k, v in batch.items()})
    model.eval()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="default benchmarks/results/anchor-pass-<device>.json")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from pofe.anchor import AnchorLogps
    from pofe.demo.tiny import build_tiny_model

    torch.set_num_threads(1)
    batch_size, k = 4, 4
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(os.path.join(tmp, "model"), hidden_size=128))
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").to(args.device)
        trainer = stand_in_trainer(args.rows, path, tmp, data=varied_rows(args.rows, k))
        trainer.args.device = torch.device(args.device)
        tables = {}

        def anchor(sort: bool):
            tables[sort] = AnchorLogps(trainer).compute(model, sort_by_length=sort)

        variants = {
            "anchor_sorted": timed(lambda: anchor(True), args.device),
            "anchor_unsorted": timed(lambda: anchor(False), args.device),
            "epoch_forward": timed(lambda: epoch_forward(model, trainer, batch_size), args.device),
        }
        interleaved(variants, 1)  # warm-up
        times = interleaved(variants, args.reps)
    med = {name: statistics.median(v) for name, v in times.items()}
    out = {
        "device": args.device,
        "rows": args.rows,
        "k": k,
        "batch_size": batch_size,
        "reps": args.reps,
        "seconds_median": med,
        "seconds_all": times,
        "anchor_sorted_over_epoch_forward": med["anchor_sorted"] / med["epoch_forward"],
        "anchor_unsorted_over_sorted": med["anchor_unsorted"] / med["anchor_sorted"],
        "max_abs_table_difference": (tables[True] - tables[False]).nan_to_num().abs().max().item(),
    }
    print(f"anchor pass, {args.rows} rows x k={k}, batches of {batch_size}, medians of {args.reps}:")
    for name, s in med.items():
        print(f"  {name:16s} {s:7.2f} s")
    print(
        f"  anchor (sorted) / one epoch's forwards {out['anchor_sorted_over_epoch_forward']:.2f}x; "
        f"sorting saves {out['anchor_unsorted_over_sorted']:.2f}x; max |table difference| "
        f"{out['max_abs_table_difference']:.2e}"
    )
    write_result(Path(args.out or f"benchmarks/results/anchor-pass-{args.device}.json"), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
