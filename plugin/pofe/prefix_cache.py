"""Prefix sharing through the KV cache: each prompt runs once, its k responses attend to its keys.

Two forwards per batch, with autograd through both:

1. the B prompts (right-padded, as the packed rows hold them), recording every layer's
   keys and values (:class:`_RecordingLayer`);
2. the N = sum_b k_b responses as N rows, each reading its prompt's recorded keys and
   values through a read-only cache (:class:`_PrefixLayer`), with position ids that
   continue after its own prompt.

A response token then sees the same keys, values and rotary positions as in its own
``prompt + response`` row, and the gradient of every response reaches the prompt's
forward once, through the recorded keys and values. There is no custom mask:
transformers builds the causal + padding mask itself from the 2D attention mask
``[prompt mask | response mask]`` and the cache length, so it runs on eager, sdpa,
flash attention and FlexAttention alike (tested here on eager and sdpa; flash attention
and FlexAttention, which has no backward on the CPU, run only in `benchmarks/gpu.sh`).
Causal alignment when the query is shorter than the keys: eager/sdpa/flex masks come
from `cache_position` (query i of a response sits at key index P + i, where P is the
padded prompt length); flash attention unpads both sides with the 2D mask and aligns
bottom-right, so query i sees the real prompt keys and response keys 0..i. The right
padding between a short prompt and its response is masked out for every backend.

A second call of a layer, the recompute of (non-reentrant) gradient checkpointing,
replays the same computation: the recording layer overwrites its keys with equal ones,
the prefix layer stores nothing.
Reentrant checkpointing runs layers under `no_grad`, which would cut the gradient
through the recorded keys: :func:`cache_hidden_states` refuses it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from pofe.compat.modeling import cache_kept_under_checkpointing, fill_cache_layer, reentrant_checkpointing


class _RecordingLayer(DynamicLayer):
    """Keeps the last keys/values the layer computed; a replay overwrites them with equal ones."""

    def update(self, key_states, value_states, *args, **kwargs):
        fill_cache_layer(self, key_states, value_states)  # (B, H, P, D)
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    """Read-only prompt keys/values (N, H, P, D): returns them with the new tokens' appended."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        fill_cache_layer(self, keys, values)
        self.read = False

    def update(self, key_states, value_states, *args, **kwargs):
        self.read = True
        # not stored: the layer's recompute under checkpointing sees the same prefix
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]


def split_packed(
    input_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor, candidate_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The packed rows ``prompt, r_1 .. r_k`` (B, L) as a prompt batch and a response batch.

    Returns:
        prompt_ids, prompt_mask (B, P): prompts, right-padded (the rows start with them).
        prompt_len (B,).
        response_ids, response_mask (N, R): responses, right-padded, N = candidate_mask.sum(),
            in the row-major order of candidate_mask.
        prompt_of (N,): the prompt of each response row.
    """
    prompt_len = (segment_ids == 0).sum(1)  # (B,)
    p = int(prompt_len.max())
    counts = candidate_mask.sum(1)  # (B,)
    n = int(counts.sum())
    rows, cols = (segment_ids >= 1).nonzero(as_tuple=True)  # (T,) every response token
    cand = (counts.cumsum(0) - counts)[rows] + segment_ids[rows, cols] - 1  # (T,) its candidate
    within = position_ids[rows, cols] - prompt_len[rows]  # (T,) its index in the response
    r = int(within.max()) + 1 if within.numel() else 1
    response_ids = input_ids.new_zeros(n, r)
    response_mask = input_ids.new_zeros(n, r)
    response_ids[cand, within] = input_ids[rows, cols]
    response_mask[cand, within] = 1
    return {
        "prompt_ids": input_ids[:, :p],
        "prompt_mask": (segment_ids[:, :p] == 0).long(),
        "prompt_len": prompt_len,
        "response_ids": response_ids,
        "response_mask": response_mask,
        "prompt_of": torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts),
    }


def _per_response(t: torch.Tensor, prompt_of: torch.Tensor) -> torch.Tensor:
    """(B, ...) -> (N, ...): a view when there is one prompt, else one gathered copy."""
    if t.shape[0] == 1:
        return t.expand(prompt_of.shape[0], *t.shape[1:])
    return t.index_select(0, prompt_of)


def recorded_forward(model: torch.nn.Module, **inputs) -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]:
    """`model(**inputs)` and the keys and values every layer computed, each (B, H, P, D)."""
    recorder = Cache(layer_class_to_replicate=_RecordingLayer)
    out = model(**inputs, past_key_values=recorder, use_cache=False)
    return out, [(layer.keys, layer.values) for layer in recorder.layers]


def forward_after_prefix(
    model: torch.nn.Module,
    keys_values: list[tuple[torch.Tensor, torch.Tensor]],
    prefix_mask: torch.Tensor,
    *,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    remedy: str,
    **kwargs,
):
    """`model` on rows that continue a recorded prefix: row n's tokens attend to keys_values[:][n]
    (each (N, H, P, D), real where prefix_mask (N, P) is 1) and sit at the positions after its
    prefix's real tokens, as in the row ``prefix + input_ids`` run whole.

    Raises ValueError naming `remedy` (why, and what to set) when a layer did not read the prefix:
    its tokens would be scored without the prompt.
    """
    prefix = Cache(layers=[_PrefixLayer(k, v) for k, v in keys_values])
    length = input_ids.shape[1]
    out = model(
        input_ids=input_ids,
        attention_mask=torch.cat([prefix_mask, attention_mask], 1),  # (N, P + R)
        position_ids=prefix_mask.sum(1, keepdim=True) + torch.arange(length, device=input_ids.device),  # (N, R)
        past_key_values=prefix,
        use_cache=False,
        **kwargs,
    )
    if not prefix.layers or not all(layer.read for layer in prefix.layers):
        raise ValueError(f"{type(model).__name__} did not read the prompt's KV cache in every layer ({remedy})")
    return out


def cache_hidden_states(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    segment_ids: torch.Tensor,
    position_ids: torch.Tensor,
    candidate_mask: torch.Tensor,
    *,
    logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The final hidden states that predict every response token of a packed batch, via the cache.

    Args:
        input_ids, segment_ids, position_ids: (B, L) packed rows (`pofe.prefix`).
        candidate_mask: (B, K) real candidates.
        logits: return the logits the forwards' own head computed at those positions
            instead (for models whose head cannot be called apart, `pofe.scoring`).

    Returns:
        hidden (M, H) (logits (M, V)), target ids (M,) and flat candidate indices (M,)
        (row-major over the True entries of candidate_mask), one per scored response token.
    """
    if torch.is_grad_enabled() and model.training and reentrant_checkpointing(model):
        raise ValueError(
            "the cache layout of prefix sharing needs non-reentrant gradient checkpointing "
            "(reentrant checkpoints cut the gradient through the prompt's keys); set "
            "`gradient_checkpointing_kwargs: {use_reentrant: false}` or `pofe.prefix_layout: packed`"
        )
    s = split_packed(input_ids, segment_ids, position_ids, candidate_mask)
    prompt_of = s["prompt_of"]
    outputs = dict(logits_to_keep=0) if logits else dict(output_hidden_states=True, logits_to_keep=1)
    # checkpointed decoder layers drop the cache unless told that a replay reads the same states, as ours do
    with cache_kept_under_checkpointing(model):
        prompt_out, keys_values = recorded_forward(
            model, input_ids=s["prompt_ids"], attention_mask=s["prompt_mask"], **outputs
        )
        response_out = forward_after_prefix(
            model,
            [(_per_response(k, prompt_of), _per_response(v, prompt_of)) for k, v in keys_values],  # each (N, H, P, D)
            _per_response(s["prompt_mask"], prompt_of),
            input_ids=s["response_ids"],
            attention_mask=s["response_mask"],
            remedy="a transformers version that drops the cache under gradient checkpointing, or a "
            "model whose attention keeps its own cache; set `pofe.prefix_layout: packed`",
            **outputs,
        )
    prompt_len = s["prompt_len"]
    prompt_hidden = prompt_out.logits if logits else prompt_out.hidden_states[-1]  # (B, P, H|V)
    response_hidden = response_out.logits if logits else response_out.hidden_states[-1]  # (N, R, H|V)

    # token j >= 1 of response n is predicted at (n, j - 1); token 0 at its prompt's last
    # position (not scored with an empty prompt, as in the unshared layout)
    mask = s["response_mask"].bool()  # (N, R)
    later_rows, later_cols = mask[:, 1:].nonzero(as_tuple=True)
    first_rows = (mask[:, 0] & (prompt_len[prompt_of] > 0)).nonzero(as_tuple=True)[0]
    hidden = torch.cat(
        [
            prompt_hidden[prompt_of[first_rows], prompt_len[prompt_of[first_rows]] - 1],
            response_hidden[later_rows, later_cols],
        ]
    )  # (M, H)
    targets = torch.cat([s["response_ids"][first_rows, 0], s["response_ids"][later_rows, later_cols + 1]])
    return hidden, targets, torch.cat([first_rows, later_rows])
