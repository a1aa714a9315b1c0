"""What `pofe.anchor_mix`'s pi_0 pass costs, as a ratio to the anchor pass it joins.

    python -m benchmarks.pi_0_pass [--rows 128] [--reps 3] [--device cpu|cuda]

A tiny Llama (hidden 128, 2 layers, random weights) with a LoRA adapter (r 8 on q and v, B
non-zero), `rows` synthetic rows of k = 4 responses (`benchmarks.anchor_pass.varied_rows`:
log-normal lengths), batches of 4, prefix sharing (packed rows). Variants, interleaved (medians):

  anchor        `AnchorLogps.compute` of the LoRA policy: the existing pass, every run with SPPO
  adapter_off   the same pass with the adapter disabled (`pofe.anchor.pi_0`'s route "adapter":
                the policy is an adapter on pi_0)
  apart         `pofe.anchor.pi_0.compute_apart`: pi_0 (the base folder) loaded on its own, the
                same pass, freed (the route "apart": rounds 2..T of an iterated run)
  apart_pass    the pass alone of "apart", on pi_0 already loaded (what the loading adds: apart -
                apart_pass)

Seconds are CPU seconds of this process on the CPU, wall clock on CUDA (benchmarks/judges.py's
`clock`). Prints each ratio to the anchor pass. Writes benchmarks/results/pi-0-pass-<device>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.anchor_pass import varied_rows
from benchmarks.anchor_ranks import stand_in_trainer
from benchmarks.judges import interleaved, timed, write_result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=None, help="default benchmarks/results/pi-0-pass-<device>.json")
    args = parser.parse_args(argv)
    from axolotl.utils.dict import DictDefault
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from pofe.anchor import AnchorLogps
    from pofe.anchor.pi_0 import adapter_disabled, compute_apart
    from pofe.anchor.table import score_rows
    from pofe.demo.tiny import build_tiny_model

    torch.set_num_threads(1)
    k = 4
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(os.path.join(tmp, "model"), hidden_size=128))
        torch.manual_seed(0)
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        base = AutoModelForCausalLM.from_pretrained(path)  # default attention, as `load_policy` loads pi_0
        policy = get_peft_model(base, lora).to(args.device).eval()
        pi_0 = AutoModelForCausalLM.from_pretrained(path).to(args.device).eval()
        trainer = stand_in_trainer(args.rows, path, tmp, data=varied_rows(args.rows, k))
        trainer.args.device = torch.device(args.device)
        anchor = AnchorLogps(trainer)
        scorer = anchor._scorer()
        datasets = [trainer.train_dataset]
        cfg = DictDefault(base_model=path, dataset_prepared_path=tmp)
        tables = {}

        def adapter_off():
            with adapter_disabled(policy):
                tables["adapter_off"] = score_rows(policy, datasets, scorer, "pi_0")

        variants = {
            "anchor": timed(lambda: tables.update(anchor=anchor.compute(policy)), args.device),
            "adapter_off": timed(adapter_off, args.device),
            "apart": timed(lambda: tables.update(apart=compute_apart(cfg, path, datasets, scorer)), args.device),
            "apart_pass": timed(lambda: score_rows(pi_0, datasets, scorer, "pi_0", ranks=(0, 1)), args.device),
        }
        interleaved(variants, 1)  # warm-up
        times = interleaved(variants, args.reps)
    med = {name: statistics.median(v) for name, v in times.items()}
    out = {
        "device": args.device,
        "rows": args.rows,
        "k": k,
        "batch_size": scorer.batch_size,
        "reps": args.reps,
        "seconds_median": med,
        "seconds_all": times,
        "over_anchor": {name: s / med["anchor"] for name, s in med.items() if name != "anchor"},
        # the two routes give pi_0's log-probs: the same numbers, up to float rounding
        "max_abs_adapter_off_vs_apart": (tables["adapter_off"] - tables["apart"]).nan_to_num().abs().max().item(),
        "max_abs_anchor_vs_apart": (tables["anchor"] - tables["apart"]).nan_to_num().abs().max().item(),
    }
    print(f"pi_0 pass, {args.rows} rows x k={k}, batches of {scorer.batch_size}, medians of {args.reps}:")
    for name, s in med.items():
        ratio = f"  {s / med['anchor']:.2f}x the anchor pass" if name != "anchor" else ""
        print(f"  {name:12s} {s:7.2f} s{ratio}")
    print(
        f"  |adapter_off - apart| max {out['max_abs_adapter_off_vs_apart']:.2e}; "
        f"|anchor - apart| max {out['max_abs_anchor_vs_apart']:.2e} (the adapter's effect)"
    )
    write_result(Path(args.out or f"benchmarks/results/pi-0-pass-{args.device}.json"), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
