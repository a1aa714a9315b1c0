"""The cache layout of prefix sharing (pofe.prefix_cache) and the rule that picks a layout.

Its equality with the unshared layout (eager, sdpa, padding, empty prompts, LoRA on
lm_head, gradient checkpointing, micro-batches) is tested with the packed layout's, in
tests/test_prefix_sharing.py; here: the split of a packed batch by hand, the forwards
it makes (no 4D mask, query shorter than the keys), reentrant checkpointing, and the
layout rule.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from pofe.collator import KResponseCollator
from pofe.prefix import CACHE_FACTOR, attention_scores, choose_layout
from pofe.prefix_cache import split_packed
from pofe.scoring import score_candidates
from tests.helpers import features, load_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_split_packed_by_hand(tokenizer):
    """Prompt [10, 11] with responses [12, 13], [14]; prompt [20] with [21, 22, 23].

    Prompts right-padded to P = 2, responses to R = 3, in candidate order; the response
    rows point back at prompts 0, 0, 1.
    """
    feats = [
        {"prompt_ids": [10, 11], "response_ids": [[12, 13], [14]]},
        {"prompt_ids": [20], "response_ids": [[21, 22, 23]]},
    ]
    b = KResponseCollator(tokenizer, prefix_sharing=True, pad_to_multiple_of=8)(feats)
    s = split_packed(b["input_ids"], b["segment_ids"], b["position_ids"], b["candidate_mask"])
    assert s["prompt_ids"][0].tolist() == [10, 11] and s["prompt_ids"][1, 0] == 20
    assert s["prompt_mask"].tolist() == [[1, 1], [1, 0]]
    assert s["prompt_len"].tolist() == [2, 1]
    assert s["response_ids"].tolist() == [[12, 13, 0], [14, 0, 0], [21, 22, 23]]
    assert s["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert s["prompt_of"].tolist() == [0, 0, 1]


def test_cache_layout_forwards(tiny64_model, tokenizer):
    """Two forwards, neither with a 4D mask: the prompts (B = 2 rows of P = 3), then the
    3 responses (R = 4) with a 2D mask over P + R keys and positions P_b, P_b + 1, ..."""
    model = load_llama(tiny64_model, "sdpa")
    feats = [
        {"prompt_ids": [10, 11, 12], "response_ids": [[13, 14], [15, 16, 17, 18]]},
        {"prompt_ids": [20, 21], "response_ids": [[22]]},
    ]
    calls = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(kwargs), with_kwargs=True)
    try:
        score_candidates(model, KResponseCollator(tokenizer, prefix_sharing=True)(feats), prefix_layout="cache")
    finally:
        hook.remove()
    prompts, responses = calls
    assert prompts["input_ids"].shape == (2, 3) and prompts["attention_mask"].dim() == 2
    assert responses["input_ids"].shape == (3, 4)
    assert responses["attention_mask"].tolist() == [
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [1, 1, 0, 1, 0, 0, 0],
    ]
    assert responses["position_ids"].tolist() == [[3, 4, 5, 6], [3, 4, 5, 6], [2, 3, 4, 5]]


def test_cache_layout_refuses_reentrant_checkpointing(tiny64_model, tokenizer):
    model = load_llama(tiny64_model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    batch = KResponseCollator(tokenizer, prefix_sharing=True)(features())
    with pytest.raises(ValueError, match="use_reentrant: false"):
        score_candidates(model, batch, prefix_layout="cache")


def test_attention_scores_by_hand():
    """One prompt of 4 tokens, responses of 3 and 1 (row 4 + 3 + 1 = 8, padded to 10).

    packed: 10 x 10 = 100. cache: 4 x 4 prompt + 2 rows x 3 x (4 + 3) = 16 + 42 = 58.
    """
    seg = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, -1, -1]])
    assert attention_scores(seg, torch.tensor([[True, True]])) == (100, 58)


def paper_row(prompt: int, k: int, response: int) -> torch.Tensor:
    """Segment ids of one packed row: a prompt and k responses of one length."""
    return torch.tensor([[0] * prompt + [i for i in range(1, k + 1) for _ in range(response)]])


@pytest.mark.parametrize(
    "prompt, k, response, expected",
    [
        # (64 + 768)^2 = 692,224 vs 64^2 + 6 x 128 x 192 = 151,552: 4.6x
        (64, 6, 128, "cache"),
        # 1536^2 = 2,359,296 vs 512^2 + 8 x 128 x 640 = 917,504: 2.6x
        (512, 8, 128, "cache"),
        # 512^2 = 262,144 vs 256^2 + 2 x 128 x 384 = 163,840: 1.6x
        (256, 2, 128, "packed"),
    ],
)
def test_auto_layout_by_shape(prompt, k, response, expected):
    seg, mask = paper_row(prompt, k, response), torch.ones(1, k, dtype=torch.bool)
    assert CACHE_FACTOR == 2.0  # the ratios above are worked against it
    assert choose_layout("auto", "sdpa", seg, mask) == expected
    assert choose_layout("auto", "eager", seg, mask) == expected
    # no 4D mask: always the cache; reentrant checkpointing: always packed
    assert choose_layout("auto", "flash_attention_2", seg, mask) == "cache"
    assert choose_layout("auto", "sdpa", seg, mask, reentrant=True) == "packed"
    assert choose_layout("packed", "sdpa", seg, mask) == "packed"
    assert choose_layout("cache", "sdpa", seg, mask) == "cache"


def test_unknown_layout_raises():
    with pytest.raises(ValueError, match="prefix layout must be one of"):
        choose_layout("dense", "sdpa", paper_row(2, 1, 1), torch.ones(1, 1, dtype=torch.bool))


def test_cache_dropped_by_a_layer_raises(tiny64_model, tokenizer, monkeypatch):
    """Without `_can_checkpoint_with_cache` (older transformers), checkpointed layers drop the
    cache: the responses would be scored without their prompt. That must fail loudly."""
    from pofe import prefix_cache

    model = load_llama(tiny64_model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    monkeypatch.setattr(prefix_cache, "cache_kept_under_checkpointing", lambda m: contextlib.nullcontext())
    batch = KResponseCollator(tokenizer, prefix_sharing=True)(features())
    with pytest.raises(ValueError, match="did not read the prompt's KV cache"):
        score_candidates(model, batch, prefix_layout="cache")
