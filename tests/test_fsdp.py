"""Scoring under FSDP2 (`fully_shard`, two gloo processes on the CPU) equals one process.

Each rank scores two of four prompts (unequal token counts, so unequal numbers of
output-embedding chunks) in the three layouts, trains on their RRHF loss and scores them
again without gradients; the mean of the ranks' losses, every rank's full gradients and
the log-probs must equal one process scoring all four prompts. Two shardings:

- the decoder layers as units, the root (holding embeddings, norm and head) resharded
  after the forward as accelerate asks: scoring keeps the root whole and calls the head
  apart, in chunks (the fast path);
- the head as a unit of its own: a call of it apart would gather its weights once per
  chunk, unpaired across ranks, so the forward runs it (the fallback, with a log line).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch

from tests.helpers import TIMEOUT_S, WORLD, assert_float_close, features, n_terms, spawn_ranks

LAYOUTS = {"unshared": ("auto", False), "packed": ("packed", True), "cache": ("cache", True)}
SHARDINGS = ("root_head", "head_apart")
CHUNK = 5  # output-embedding rows per chunk: several chunks per rank, a different count on each


def _loss(logp, lengths, batch):
    from pofe.losses import rrhf_loss

    return rrhf_loss(logp, lengths, batch["rewards"], mask=batch["candidate_mask"], margin=0.1)[0]


def _score_all(model, params, rows, tokenizer):
    """For each layout: log-probs, RRHF loss, full gradients, no-grad log-probs, head run apart?"""
    from pofe.collator import KResponseCollator
    from pofe.scoring import score_candidates, scoring_head

    results = {}
    for name, (layout, shared) in LAYOUTS.items():
        batch = KResponseCollator(tokenizer, prefix_sharing=shared)(rows)
        for p in params.values():  # the optimizer's zero_grad: on the (sharded) parameters themselves
            p.grad = None
        model.train()
        logp, lengths = score_candidates(model, batch, chunk_size=CHUNK, prefix_layout=layout)
        loss = _loss(logp, lengths, batch)
        loss.backward()
        grads = {n: getattr(p.grad, "full_tensor", lambda g=p.grad: g)().clone() for n, p in params.items()}
        model.eval()
        with torch.no_grad():
            no_grad, _ = score_candidates(model, batch, chunk_size=CHUNK, prefix_layout=layout)
        results[name] = {
            "logp": logp.detach(),
            "loss": loss.detach(),
            "grads": grads,
            "no_grad": no_grad,
            "head_apart": not scoring_head(model)[1],
        }
    return results


def _worker(rank, store, model_path, out):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from pofe.demo.tiny import build_tokenizer
    from tests.helpers import load_llama

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=TIMEOUT_S)
    )
    try:
        saved = {}
        rows = features()[2 * rank : 2 * rank + 2]
        for sharding in SHARDINGS:
            model = load_llama(model_path)
            for layer in model.model.layers:
                fully_shard(layer)
            if sharding == "head_apart":
                fully_shard(model.lm_head)
            fully_shard(model, reshard_after_forward=True)  # accelerate's FSDP2 default
            params = dict(model.named_parameters())  # the sharded DTensors, before any forward
            saved[sharding] = _score_all(model, params, rows, build_tokenizer())
        torch.save(saved, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp_ranks(tmp_path_factory, tiny64_model):
    out = tmp_path_factory.mktemp("fsdp")
    return spawn_ranks(_worker, out, str(tiny64_model), str(out))


@pytest.fixture(scope="module")
def one_process(tiny64_model, tokenizer):
    """Every layout on all four prompts in one process, unsharded."""
    from tests.helpers import load_llama

    model = load_llama(tiny64_model)
    return _score_all(model, dict(model.named_parameters()), features(), tokenizer)


@pytest.mark.parametrize("sharding", SHARDINGS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fsdp2_scoring_equals_one_process(fsdp_ranks, one_process, sharding, layout):
    one = one_process[layout]
    ranks = [saved[sharding][layout] for saved in fsdp_ranks]
    # the fast path where the head sits in the root's group, the forward's head where it is a unit
    assert [r["head_apart"] for r in ranks] == [sharding == "root_head"] * WORLD
    assert one["head_apart"]
    for rank, saved in enumerate(ranks):
        rows = slice(2 * rank, 2 * rank + 2)
        k = saved["logp"].shape[1]
        n = n_terms(features())  # float32 sums of width x tokens, in another order
        assert_float_close(saved["logp"], one["logp"][rows, :k], n)
        assert_float_close(saved["no_grad"], one["no_grad"][rows, :k], n)
        assert saved["grads"].keys() == one["grads"].keys()
        for name, grad in one["grads"].items():  # FSDP averages the ranks' gradients
            assert_float_close(
                saved["grads"][name], grad, n, msg=lambda m, rank=rank, name=name: f"rank {rank} {name}: {m}"
            )
    # each rank's loss is a mean over its 2 prompts: their mean is the 4-prompt mean
    assert_float_close(sum(r["loss"] for r in ranks) / WORLD, one["loss"], n_terms(features()))
