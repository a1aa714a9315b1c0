"""Prefix sharing: one packed row ``prompt, r_1, ..., r_k`` per prompt.

The k candidates of a prompt share its prompt, so the prompt is encoded once. Each
packed row carries:

    segment_ids  (L,)  -1 padding, 0 prompt, i the i-th response (1-based)
    position_ids (L,)  0..P-1 for the prompt, then P, P+1, ... again for every response

and attention follows :func:`block_attention_mask`: a prompt token sees the earlier
prompt tokens, a response token sees the whole prompt and the earlier tokens of its
own response, never another response. With these positions and this mask every
response token sees exactly the keys, values and rotary positions it sees in its own
``prompt + response`` row, so log-probs and gradients equal the unshared layout's
(up to float rounding in the sums).

The mask is a custom 4D tensor, which transformers passes through unchanged to the
eager and sdpa kernels (``masking_utils._preprocess_mask_arguments`` returns 4D masks
as-is). Flash-attention kernels take no such mask and sample packing builds its own
rows: there POFE falls back to the unshared layout (:func:`prefix_sharing_enabled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .args import pofe_config
from .logs import get_logger
from .modeling import attention_backend, model_config

LOG = get_logger(__name__)

# attention backends (transformers' `config._attn_implementation`) that accept a custom 4D mask
MASK_BACKENDS = ("eager", "sdpa")


def prefix_sharing_blocker(cfg: Mapping[str, Any], is_eval: bool = False) -> str | None:
    """Why this axolotl config (its DictDefault, or the raw dict) cannot use prefix sharing, or None."""
    if cfg.get("sample_packing") or (is_eval and cfg.get("eval_sample_packing")):
        return "sample packing builds its own packed rows"
    attn = cfg.get("attn_implementation")
    if attn is not None and attn not in MASK_BACKENDS:
        return f"attn_implementation {attn!r} takes no custom 4D attention mask (only {MASK_BACKENDS} do)"
    return None


def prefix_sharing_enabled(cfg: Mapping[str, Any], is_eval: bool = False) -> bool:
    """`pofe.prefix_sharing` unless the config rules it out; logs the fallback once.

    The plugin's `get_collator_cls_and_kwargs` passes the result to `KResponseCollator`.
    """
    if not pofe_config(cfg).prefix_sharing:
        return False
    reason = prefix_sharing_blocker(cfg, is_eval)
    if reason is not None:
        # the train and the eval collator both ask: say it once per reason
        LOG.warning_once(f"POFE: prefix sharing off ({reason}); scoring k full rows per prompt")
        return False
    return True


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


def check_backend(model: torch.nn.Module, position_ids: torch.Tensor) -> None:
    """Raise if the model cannot run a packed batch exactly (the collator was misconfigured)."""
    backend = attention_backend(model)
    if backend not in MASK_BACKENDS:
        raise ValueError(
            f"a prefix-shared batch reached a model running attn_implementation {backend!r}, "
            f"which takes no custom 4D mask; set `pofe.prefix_sharing: false`"
        )
    config = model_config(model)
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and int(position_ids.max()) + 1 > window:
        raise ValueError(
            f"prefix sharing does not model the sliding window ({window} tokens) and this "
            f"batch is longer; set `pofe.prefix_sharing: false`"
        )
