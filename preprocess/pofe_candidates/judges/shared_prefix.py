"""Reward-model forwards that run each prompt once for its K candidates.

A decoder reads ``prompt + response`` causally, so the keys and values of the tokens that
the K rows of one prompt share (the template's rendering of the prompt, and any common start
of the responses) are the same in all K rows. They are computed once per prompt
(`pofe.prefix_cache.recorded_forward`), and each row's remaining tokens, its tail, attend to
them at the positions that follow (`forward_after_prefix`). The classifier pools the tail's
last token, which is the row's: each score equals the whole row's up to float rounding, and
the shared tokens run once instead of K times.

Two passes per window of prompts, each in length-sorted batches of `batch_size` rows:

1. the shared prefixes, one row per prompt, their keys and values kept;
2. the tails, sorted by length across the window (the K tails of one prompt differ in length
   as much as any two), each batch gathering its prompts' keys and values, right-padded.

A window holds prompts until their prefixes reach `window_tokens` (the judge passes
batch_size x max_length): the keys and values kept, 2 x layers x kv-width per token, are then
about the activations of one full batch, which the judge needs anyway.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from pofe.batching import length_sorted_batches
from pofe.prefix_cache import forward_after_prefix, recorded_forward

# one prompt's rows: (the row's index in the caller's flat list, its token ids)
Rows = list[tuple[int, list[int]]]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_length(rows: list[list[int]], pad_id: int | None) -> int:
    """The leading tokens the rows run once: their common prefix, leaving every row its last
    token that is not `pad_id` (the classifier pools at the last non-pad token; a tail of pad
    ids alone would pool elsewhere). 0 for one row, which has nothing to share."""
    if len(rows) < 2:
        return 0
    shared = min(common_prefix(rows[0], row) for row in rows[1:])
    for row in rows:
        last = next((n for n in range(len(row) - 1, -1, -1) if row[n] != pad_id), 0)
        shared = min(shared, last)
    return shared


def reads_causally(config) -> bool:
    """Whether a model of this config reads left to right (a decoder): transformers maps its type
    to a causal LM and not to a masked LM (BERT-likes are both, reading both ways as encoders)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(config, "model_type", None)
    return (
        kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and not getattr(config, "is_encoder_decoder", False)
    )


def windows(lengths: list[int], budget: int) -> Iterator[list[int]]:
    """Consecutive indices of `lengths`, each run summing to at most `budget` (at least one)."""
    window: list[int] = []
    total = 0
    for n, length in enumerate(lengths):
        if window and total + length > budget:
            yield window
            window, total = [], 0
        window.append(n)
        total += length
    if window:
        yield window


def _right_padded(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L) ids padded with pad_id and the (N, L) mask of real tokens."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for n, row in enumerate(rows):
        ids[n, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[n, : len(row)] = 1
    return ids.to(device), mask.to(device)


def _prefix_keys_values(model, heads: list[list[int]], batch_size: int, pad_id: int, device) -> list[list]:
    """Pass 1: every non-empty head run once; per head, each layer's (H, P, D) keys and values."""
    kept: list[list] = [[] for _ in heads]
    live = [n for n, h in enumerate(heads) if h]
    for batch in length_sorted_batches([len(heads[n]) for n in live], batch_size):
        chunk = [live[m] for m in batch]
        ids, mask = _right_padded([heads[n] for n in chunk], pad_id, device)
        _, keys_values = recorded_forward(model, input_ids=ids, attention_mask=mask)
        for row, n in enumerate(chunk):
            kept[n] = [(k[row, :, : len(heads[n])], v[row, :, : len(heads[n])]) for k, v in keys_values]
    return kept


def _gathered(kept: list[list], owners: list[int], width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the owners' (H, P, D) keys and values right-padded to `width`: (N, H, width, D).
    A row whose prompt shares nothing gets zeros, masked like any padding."""
    template = next(kept[g] for g in owners if kept[g])

    def padded(g: int, layer: int, which: int) -> torch.Tensor:
        if not kept[g]:
            like = template[layer][which]
            return like.new_zeros(like.shape[0], width, like.shape[2])
        t = kept[g][layer][which]
        return F.pad(t, (0, 0, 0, width - t.shape[1]))

    return [
        tuple(torch.stack([padded(g, layer, which) for g in owners]) for which in (0, 1))
        for layer in range(len(template))
    ]


def prefix_shared_forwards(
    model: torch.nn.Module,
    groups: list[Rows],
    *,
    batch_size: int,
    window_tokens: int,
    pad_id: int,
    device,
    remedy: str,
) -> Iterator[tuple[list[int], object]]:
    """`model`'s output for every row of `groups` (one list of rows per prompt), batch by batch,
    each prompt's shared prefix run once (module docstring). Yields (the rows' flat indices,
    the model's output for them, in that order)."""
    shared = [shared_length([ids for _, ids in rows], pad_id) for rows in groups]
    for window in windows(shared, window_tokens):
        heads = [groups[g][0][1][: shared[g]] if shared[g] else [] for g in window]
        kept = _prefix_keys_values(model, heads, batch_size, pad_id, device)
        tails = [(w, index, ids[shared[g] :]) for w, g in enumerate(window) for index, ids in groups[g]]
        for batch in length_sorted_batches([len(t[2]) for t in tails], batch_size):
            owners, indices, rows = zip(*(tails[m] for m in batch))
            ids, mask = _right_padded(list(rows), pad_id, device)
            width = max(len(heads[w]) for w in owners)
            if width == 0:  # no row of the batch shares a prefix
                yield list(indices), model(input_ids=ids, attention_mask=mask)
                continue
            prefix_mask = torch.zeros((len(owners), width), dtype=torch.long)
            for n, w in enumerate(owners):
                prefix_mask[n, : len(heads[w])] = 1
            yield (
                list(indices),
                forward_after_prefix(
                    model,
                    _gathered(kept, list(owners), width),
                    prefix_mask.to(device),
                    input_ids=ids,
                    attention_mask=mask,
                    remedy=remedy,
                ),
            )
