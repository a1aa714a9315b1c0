"""Prefix sharing: the k candidates of a prompt share its prompt, so it is encoded once.

The collator packs one row ``prompt, r_1, ..., r_k`` per prompt. Each packed row carries:

    segment_ids  (L,)  -1 padding, 0 prompt, i the i-th response (1-based)
    position_ids (L,)  0..P-1 for the prompt, then P, P+1, ... again for every response

and scoring runs it in one of two layouts (`pofe.prefix_layout`), both exact: every
response token sees exactly the keys, values and rotary positions it sees in its own
``prompt + response`` row, so log-probs and gradients equal the unshared layout's (up to
float rounding in the sums).

- ``packed``: the row as it is, attention following :func:`block_attention_mask` (a
  prompt token sees the earlier prompt tokens, a response token the whole prompt and the
  earlier tokens of its own response). The mask is a custom 4D tensor, which transformers
  passes unchanged to the eager and sdpa kernels (``masking_utils`` returns 4D masks
  as-is); the kernels then score all L x L pairs, most of them masked.
- ``cache``: the prompts run once, their keys and values are kept, and the responses run
  as k rows each that read them (`pofe.prefix_cache`). No custom mask, so any backend
  (flash attention, FlexAttention included); it pays two forwards and a copy of the
  prompt's keys per response row instead of the masked scores.

``auto`` takes the cache layout where the backend takes no 4D mask, and otherwise for each
batch the one with fewer attention scores to compute, the packed row's counted at a
:data:`CACHE_FACTOR` discount (:func:`choose_layout`). Sample packing builds its own rows:
there POFE falls back to the unshared layout (:func:`prefix_sharing_enabled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pofe.args import PofeConfig
from pofe.distributed import sum_over_ranks
from pofe.logs import get_logger
from pofe.modeling import attention_backend, model_config

LOG = get_logger(__name__)

# attention backends (transformers' `config._attn_implementation`) that accept a custom 4D mask
MASK_BACKENDS = ("eager", "sdpa")
PREFIX_LAYOUTS = ("auto", "packed", "cache")
# `auto` runs the cache layout when the packed rows have more than CACHE_FACTOR times its
# attention scores (:func:`attention_scores`). Measured on the CPU (benchmarks/run.py, sdpa,
# 1 thread, medians of 5, s/step packed vs cache): 1.6x (k = 2, prompt 256, responses
# 128): 1.08 vs 1.30; 2.6x (k = 8, prompt 512): 2.21 vs 1.98; 4.6x (k = 6, prompt 64):
# 2.96 vs 2.54. The cache layout's fixed costs (a second forward, the copied keys) put
# the break-even between 1.6x and 2.6x.
CACHE_FACTOR = 2.0


def _configured_reentrant(cfg: Mapping[str, Any]) -> bool:
    """Whether the axolotl config checkpoints layers in a way that cuts the cache layout's gradient."""
    mode = cfg.get("gradient_checkpointing")
    if not mode:
        return False
    if mode is not True:  # axolotl's `offload` and similar modes run their own autograd function
        return True
    return bool((cfg.get("gradient_checkpointing_kwargs") or {}).get("use_reentrant", False))


def prefix_sharing_blocker(cfg: Mapping[str, Any], is_eval: bool = False) -> str | None:
    """Why this axolotl config (its DictDefault, or the raw dict) cannot use prefix sharing, or None."""
    if cfg.get("sample_packing") or (is_eval and cfg.get("eval_sample_packing")):
        return "sample packing builds its own packed rows"
    attn = cfg.get("attn_implementation")
    if attn is not None and attn not in MASK_BACKENDS and not is_eval and _configured_reentrant(cfg):
        return (
            f"attn_implementation {attn!r} takes no custom 4D mask and reentrant gradient "
            "checkpointing cuts the cache layout's gradient; set "
            "`gradient_checkpointing_kwargs: {use_reentrant: false}` to share prompts"
        )
    return None


def layout_rule(layout: str, attn: str | None, reentrant: bool) -> str:
    """What `pofe.prefix_layout` runs on this backend, in words (the log line); `attn` None is sdpa."""
    packed, cache = "packed rows with a block attention mask", "the prompts' KV cache"
    if layout == "packed":
        return packed
    if layout == "cache":
        return cache
    if attn is not None and attn not in MASK_BACKENDS:
        return f"{cache} ({attn} takes no 4D mask)"
    if reentrant:
        return f"{packed} (reentrant gradient checkpointing)"
    return (
        f"chosen per batch: {cache} where packed rows would compute over {CACHE_FACTOR:g}x its "
        f"attention scores, else {packed}"
    )


def prefix_sharing_enabled(cfg: Mapping[str, Any], pofe: PofeConfig, is_eval: bool = False) -> bool:
    """`pofe.prefix_sharing` unless the config rules it out; logs the layout that runs.

    `pofe` is `cfg`'s validated `pofe:` block. The plugin's `get_collator_cls_and_kwargs`
    passes the result to `KResponseCollator` (once for the train and once for the eval
    collator: one line each).
    """
    split = "eval" if is_eval else "train"
    if not pofe.prefix_sharing:
        return False
    attn = cfg.get("attn_implementation")
    reentrant = not is_eval and _configured_reentrant(cfg)  # eval runs without gradients
    if pofe.prefix_layout == "packed" and attn is not None and attn not in MASK_BACKENDS:
        raise ValueError(
            f"pofe.prefix_layout: packed needs attn_implementation in {MASK_BACKENDS} (a custom 4D "
            f"mask), the config sets {attn!r}; use `pofe.prefix_layout: auto` (the cache layout)"
        )
    if pofe.prefix_layout == "cache" and reentrant:
        raise ValueError(
            "pofe.prefix_layout: cache needs non-reentrant gradient checkpointing (reentrant "
            "checkpoints cut the gradient through the prompt's keys); set "
            "`gradient_checkpointing_kwargs: {use_reentrant: false}` or `pofe.prefix_layout: auto`"
        )
    reason = prefix_sharing_blocker(cfg, is_eval)
    if reason is not None:
        LOG.warning(f"POFE ({split}): prefix sharing off ({reason}); scoring k full rows per prompt")
        return False
    LOG.info(
        f"POFE ({split}): prefix sharing on, each prompt encoded once; layout "
        f"{layout_rule(pofe.prefix_layout, attn, reentrant)} (pofe.prefix_layout: {pofe.prefix_layout})"
    )
    return True


def attention_scores(segment_ids: torch.Tensor, candidate_mask: torch.Tensor) -> tuple[int, int]:
    """Query-key pairs the kernels compute for a packed batch (B, L) in each layout.

    packed: B rows of L x L (masked pairs included). cache: B prompts of P x P plus
    N = candidate_mask.sum() response rows of R x (P + R), P and R the longest prompt
    and response (each side is padded to them).
    """
    b, l = segment_ids.shape
    p = int((segment_ids == 0).sum(1).max())
    sizes = torch.nn.functional.one_hot((segment_ids + 1).clamp(min=0)).sum(1)[:, 2:]  # (B, K) tokens per response
    r = int(sizes.max()) if sizes.numel() else 0
    return b * l * l, b * p * p + int(candidate_mask.sum()) * r * (p + r)


def choose_layout(
    layout: str, backend: str, segment_ids: torch.Tensor, candidate_mask: torch.Tensor, reentrant: bool = False
) -> str:
    """`packed` or `cache` for this batch on this attention backend (see the module docstring).

    `reentrant`: the layers are checkpointed reentrantly, which only the packed layout survives.
    Under several processes `auto` weighs the scores summed over the ranks (every rank
    calls this once per batch), so all run the same layout: its number of forwards must
    match across ranks, whose collectives (sharded weights, DDP's buffer broadcast) pair up.
    """
    if layout not in PREFIX_LAYOUTS:
        raise ValueError(f"prefix layout must be one of {PREFIX_LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    if backend not in MASK_BACKENDS:
        return "cache"
    if reentrant:
        return "packed"
    scores = torch.tensor(attention_scores(segment_ids, candidate_mask))  # (packed, cache)
    packed, cache = sum_over_ranks(scores, segment_ids.device).tolist()
    return "cache" if packed > CACHE_FACTOR * cache else "packed"


def block_attention_mask(segment_ids: torch.Tensor, backend: str, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, L, L) mask from segment ids (B, L) for the `backend` kernel.

    Query q may attend key j iff j <= q and (seg[j] == 0 or seg[j] == seg[q]), both
    real. A padding query attends to itself only, so no softmax row is empty (an empty
    row gives NaN in sdpa, and NaN times a zero gradient is still NaN).

    sdpa gets a bool mask (True = attend); eager adds its mask to the scores, so it
    gets 0 / dtype-min floats like transformers' own eager mask.
    """
    b, l = segment_ids.shape
    idx = torch.arange(l, device=segment_ids.device)
    causal = idx[None, :] <= idx[:, None]  # (L, L): key <= query
    q = segment_ids[:, :, None]  # (B, L, 1)
    k = segment_ids[:, None, :]  # (B, 1, L)
    allowed = causal & ((k == 0) | (k == q)) & (q >= 0) & (k >= 0)  # (B, L, L)
    pad_self = (q < 0) & (idx[None, :] == idx[:, None])  # (B, L, L)
    allowed = (allowed | pad_self)[:, None]  # (B, 1, L, L)
    if backend == "sdpa":
        return allowed
    if backend == "eager":
        zero = torch.zeros((), dtype=dtype, device=segment_ids.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)
    raise ValueError(
        f"prefix sharing needs attn_implementation in {MASK_BACKENDS}, the model runs "
        f"{backend!r}; set `pofe.prefix_sharing: false`"
    )


def check_backend(model: torch.nn.Module, position_ids: torch.Tensor, layout: str) -> None:
    """Raise if the model cannot run a prefix-shared batch in `layout` exactly."""
    backend = attention_backend(model)
    if layout == "packed" and backend not in MASK_BACKENDS:
        raise ValueError(
            f"a packed prefix-shared batch reached a model running attn_implementation {backend!r}, "
            f"which takes no custom 4D mask; set `pofe.prefix_layout: auto` (the cache layout)"
        )
    config = model_config(model)
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and int(position_ids.max()) + 1 > window:
        raise ValueError(
            f"prefix sharing does not model the sliding window ({window} tokens) and this "
            f"batch is longer; set `pofe.prefix_sharing: false`"
        )
