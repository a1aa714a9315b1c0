"""SPPO's anchor pass on one process and on two (gloo, spawned), side by side.

    python -m benchmarks.anchor_ranks [--rows 256]

A tiny Llama (hidden 64, random weights), `rows` synthetic prompts of 24 tokens with
k = 4 responses of 32, batches of 4, prefix sharing (packed rows). Runs the real
`pofe.anchor.AnchorLogps.compute` on a stand-in trainer (what it reads of one), one
thread per process: first in this process (best of 2 after a warm-up), then on two
spawned ranks (after a warm-up; the slower rank counts). Prints both times, their
ratio and whether the two tables agree.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp


def stand_in_trainer(rows: int, model_path: str, prepared: str, data=None):
    """What `AnchorLogps` reads of a trainer; `data` (tokenised rows) defaults to `rows` rows of
    a 24-token prompt and 4 responses of 32."""
    from axolotl.utils.dict import DictDefault
    from datasets import Dataset

    from pofe.collator import KResponseCollator
    from pofe.demo.tiny import build_tokenizer
    from pofe.scoring import score_candidates

    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(4, 30, (n,), generator=g).tolist()  # noqa: E731
    data = (
        data
        if data is not None
        else Dataset.from_dict(
            {
                "row_id": list(range(rows)),
                "prompt_ids": [ids(24) for _ in range(rows)],
                "response_ids": [[ids(32) for _ in range(4)] for _ in range(rows)],
                "win_rates": [[0.5] * 4] * rows,
            }
        )
    )
    return SimpleNamespace(
        axolotl_cfg=DictDefault(base_model=model_path, dataset_prepared_path=prepared),
        train_dataset=data,
        eval_dataset=None,
        accelerator=SimpleNamespace(is_main_process=True),
        args=SimpleNamespace(device=torch.device("cpu"), per_device_eval_batch_size=4, disable_tqdm=True),
        state=SimpleNamespace(global_step=0),
        data_collator=KResponseCollator(build_tokenizer(), prefix_sharing=True),
        score_candidates=lambda model, batch: score_candidates(model, batch, prefix_layout="packed"),
    )


def timed(model, trainer) -> tuple[float, torch.Tensor]:
    from pofe.anchor import AnchorLogps

    started = time.perf_counter()
    table = AnchorLogps(trainer).compute(model)
    return time.perf_counter() - started, table


def _rank(rank: int, store: str, rows: int, model_path: str, out: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=300)
    )
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="eager")
        trainer = stand_in_trainer(rows, model_path, out)
        timed(model, trainer)  # warm-up
        dist.barrier()
        torch.save(timed(model, trainer), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from pofe.demo.tiny import build_tiny_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(build_tiny_model(os.path.join(tmp, "model"), hidden_size=64))
        model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="eager")
        trainer = stand_in_trainer(args.rows, model_path, tmp)
        timed(model, trainer)  # warm-up
        one = min((timed(model, trainer) for _ in range(2)), key=lambda r: r[0])
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), args.rows, model_path, tmp), nprocs=2)
        two = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    seconds = max(s for s, _ in two)
    same = all(torch.allclose(t, one[1], atol=1e-5, equal_nan=True) for _, t in two)
    print(
        f"anchor pass, {args.rows} rows: one process {one[0]:.2f} s, two processes {seconds:.2f} s, "
        f"speed-up {one[0] / seconds:.2f}x; tables agree: {same}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
