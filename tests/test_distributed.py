"""Two processes on the CPU (gloo, spawned): the sharded anchor pass and gathered metrics.

The workers run the real `AnchorLogps` and `KResponseTrainer.log_stats` on stand-in
trainers, which pins down the sharding of the anchor pass and the metrics' weighting by
hand (whole runs through `axolotl train` on two processes: tests/test_two_process_train.py).
They meet through a file store, so no port is needed.
"""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import TIMEOUT_S, WORLD, assert_float_close, float_tolerance, spawn_ranks

BATCH = 2
# prompts per rank for the metrics: unequal, so an unweighted mean of ranks is wrong
METRIC_SPLIT = (2, 4)


def _rows(first_id: int, count: int, seed: int):
    """Tokenised rows with 2 or 3 candidates each (padded slots stay NaN in the table)."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(4, 30, (n,), generator=g).tolist()  # noqa: E731
    responses = [[ids(2 + j) for j in range(2 + i % 2)] for i in range(count)]
    return Dataset.from_dict(
        {
            "row_id": list(range(first_id, first_id + count)),
            "prompt_ids": [ids(3 + i % 3) for i in range(count)],
            "response_ids": responses,
            "win_rates": [[0.5] * len(r) for r in responses],
        }
    )


def _anchor_trainer(model_path, prep, is_main, calls):
    from axolotl.utils.dict import DictDefault

    from pofe.collator import KResponseCollator
    from pofe.demo.tiny import build_tokenizer
    from pofe.scoring import score_candidates

    def counted(model, batch):
        calls.append(len(batch["row_id"]))
        return score_candidates(model, batch)

    return SimpleNamespace(
        axolotl_cfg=DictDefault(base_model=str(model_path), dataset_prepared_path=str(prep)),
        # 5 train rows in batches of 2: 3 batches, so the second rank is one short
        train_dataset=_rows(0, 5, seed=1),
        eval_dataset=_rows(5, 3, seed=2),
        accelerator=SimpleNamespace(is_main_process=is_main),
        args=SimpleNamespace(device=torch.device("cpu"), per_device_eval_batch_size=BATCH, disable_tqdm=True),
        state=SimpleNamespace(global_step=0),
        data_collator=KResponseCollator(build_tokenizer()),
        score_candidates=counted,
    )


def _metric_batch():
    """(6, 3) RRHF scores with distinct rewards: every prompt has 3 ordered pairs."""
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(sum(METRIC_SPLIT), 3, generator=g) * 10
    lengths = torch.randint(1, 5, logp.shape, generator=g).float()
    rewards = torch.stack([torch.randperm(3, generator=g) for _ in logp]).float()
    return logp, lengths, rewards


def _log_stats(rank_rows, training):
    """`KResponseTrainer.log_stats` for RRHF stats of `rank_rows`, and what a log then reads:
    {split: {name: value}}."""
    from pofe.losses import rrhf_loss
    from pofe.trainers.k_response import KResponseTrainer
    from pofe.trainers.metrics import MetricWindow

    logp, lengths, rewards = (t[rank_rows] for t in _metric_batch())
    _, stats = rrhf_loss(logp, lengths, rewards)
    trainer = SimpleNamespace(args=SimpleNamespace(device=torch.device("cpu")), metric_window=MetricWindow())
    KResponseTrainer.log_stats(trainer, SimpleNamespace(training=training), "rrhf", stats, len(logp))
    split = "train" if training else "eval"
    return {split: trainer.metric_window.flush(split, torch.device("cpu"))}


def _worker(rank, store, model_path, prep, out):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from pofe.anchor import AnchorLogps

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=TIMEOUT_S)
    )
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="eager")
        calls = []
        trainer = _anchor_trainer(model_path, prep, rank == 0, calls)
        started = time.perf_counter()
        table = AnchorLogps(trainer)._load_or_compute(model)
        seconds = time.perf_counter() - started
        dist.barrier()  # rank 0 has written the cache: both ranks now load it
        loaded = AnchorLogps(trainer)._load_or_compute(model)
        first = sum(METRIC_SPLIT[:rank])
        rank_rows = slice(first, first + METRIC_SPLIT[rank])
        metrics = {**_log_stats(rank_rows, training=True), **_log_stats(rank_rows, training=False)}
        torch.save(
            {"table": table, "loaded": loaded, "calls": calls, "seconds": seconds, "metrics": metrics},
            f"{out}/rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, tiny64_model):
    """Run `_worker` on two spawned processes; what each saved, and the prepared folder."""
    out = tmp_path_factory.mktemp("ranks")
    prep = out / "prep"
    return spawn_ranks(_worker, out, str(tiny64_model), str(prep), str(out)), prep


def test_two_ranks_hold_the_one_process_anchor_table(two_ranks, tiny64_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from pofe.anchor import AnchorLogps

    ranks, prep = two_ranks
    model = AutoModelForCausalLM.from_pretrained(tiny64_model, attn_implementation="eager")
    calls = []
    one = AnchorLogps(_anchor_trainer(tiny64_model, tmp_path, True, calls)).compute(model)
    assert one.shape == (8, 3) and one[:, :2].isfinite().all()
    # longest rows first (prompt + responses: train 8, 13, 10, 12, 9 tokens, eval 8, 13, 10):
    # batches [1, 3] [2, 4] [0] and [6, 7] [5]; rows 0, 2, 4 and 5 have two candidates and
    # share no batch with a three-candidate row, so their third slot is never written
    assert one[:, 2].isnan().tolist() == [True, False, True, False, True, True, False, False]
    # float32 sums over width 64 x a batch's tokens (2 rows of <= 5 + 4 + 3 + 2 tokens),
    # batched otherwise on two ranks; unwritten slots NaN in both
    n = 64 * 2 * 14
    for saved in ranks:
        assert_float_close(saved["table"], one, n)
        assert_float_close(saved["loaded"], one, n)
    # one process: 3 train + 2 eval batches; two ranks: 2 + 1 calls each, the same number
    # (ZeRO-3 needs it), rank 1 re-scoring a train batch it then drops
    assert [len(calls)] + [len(s["calls"]) for s in ranks] == [5, 3, 3]
    assert len(list(prep.glob("pofe-anchor-*.pt"))) == 1  # rank 0 wrote the cache


def test_metrics_are_means_over_every_ranks_prompts(two_ranks):
    from pofe.losses import rrhf_loss

    ranks, _ = two_ranks
    _, expected = rrhf_loss(*_metric_batch())  # one process, all 6 prompts
    # means over 6 prompts x 3 pairs of scores up to 10, summed per rank then across ranks
    tol = float_tolerance(torch.float32, n_terms=18, magnitude=10.0)
    for saved in ranks:
        train, evaluation = saved["metrics"]["train"], saved["metrics"]["eval"]
        assert train.keys() == {f"rrhf/{k}" for k in expected}
        assert evaluation.keys() == {f"eval_rrhf/{k}" for k in expected}
        for name, value in ((k, float(v)) for k, v in expected.items()):
            assert train[f"rrhf/{name}"] == pytest.approx(value, rel=tol["rtol"], abs=tol["atol"]), name
            assert evaluation[f"eval_rrhf/{name}"] == pytest.approx(value, rel=tol["rtol"], abs=tol["atol"]), name


def test_no_shm_op_build_for_deepspeed_on_cpu(monkeypatch):
    """DeepSpeed's comm would JIT-build its shared-memory op here (minutes); after the
    plugin's register() hook it finds the op unavailable and builds nothing."""
    from deepspeed.comm.torch import build_shm_op
    from deepspeed.ops import __compatible_ops__ as compatible_ops

    from pofe.distributed import skip_deepspeed_shm_build

    assert not torch.accelerator.is_available()
    monkeypatch.setitem(compatible_ops, "deepspeed_shm_comm", compatible_ops["deepspeed_shm_comm"])
    assert compatible_ops["deepspeed_shm_comm"]  # DeepSpeed's own answer on this machine: build it
    skip_deepspeed_shm_build({"deepspeed": None})  # not a DeepSpeed run: left alone
    assert compatible_ops["deepspeed_shm_comm"]
    skip_deepspeed_shm_build({"deepspeed": "zero3.json"})
    assert build_shm_op() is None
