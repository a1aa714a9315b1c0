"""The few facts POFE reads off a (possibly wrapped) transformers model.

Models reach POFE bare, or wrapped by PEFT, DDP, DeepSpeed or FSDP; these helpers look
through the wrappers (and say where a wrapper keeps POFE from calling the output
embedding by itself: :func:`head_outside_forward`). This module is a leaf: it imports torch only
(and `pofe.compat`).
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

from pofe.compat.distributed import is_zero3_partitioned
from pofe.compat.modeling import attn_implementation

# Config attributes of models whose logits are not just `lm_head(hidden)`: scoring
# through the output embedding alone would be wrong for them.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def model_config(model: torch.nn.Module):
    """The HF config through DDP / PEFT wrappers (PeftModel forwards `.config`)."""
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "module"):
        config = getattr(model.module, "config", None)
    return config


def attention_backend(model: torch.nn.Module) -> str:
    """The model's attention implementation ("eager", "sdpa", "flash_attention_2", ...)."""
    return attn_implementation(model_config(model)) or "sdpa"


def mask_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of the input embeddings, which transformers uses for its own float masks."""
    try:
        inner = model if hasattr(model, "get_input_embeddings") else model.module
        return inner.get_input_embeddings().weight.dtype
    except AttributeError:
        return torch.float32


def output_embedding(model: torch.nn.Module) -> torch.nn.Module:
    """`lm_head` as a module (a LoRA-wrapped head stays wrapped: callers call it, never its weight)."""
    inner = model.module if not hasattr(model, "get_output_embeddings") and hasattr(model, "module") else model
    head = inner.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(inner).__name__} has no output embedding (get_output_embeddings() is None)")
    return head


def logits_are_plain(model: torch.nn.Module) -> bool:
    """True when the model's logits are exactly `lm_head(final hidden state)`."""
    config = model_config(model)
    if config is None:
        return False
    configs = [config] + ([config.text_config] if getattr(config, "text_config", None) is not None else [])
    return all(getattr(c, name, None) in (None, 1, 1.0) for c in configs for name in LOGIT_TRANSFORMS)


def head_outside_forward(model: torch.nn.Module) -> str | None:
    """Make the output embedding callable after the model's forward; else say why it is not.

    Memory-light scoring calls `lm_head` outside the model's root forward, a different
    number of times on each rank (one call per chunk of that rank's response tokens).
    That is exact where the head's weights are whole after the forward: a bare model, DDP,
    and FSDP2 with the head in the root's parameter group, which this function keeps
    unsharded after the forward (`set_reshard_after_forward(False)` on the root only: the
    backward gathers them again at once otherwise; it is FSDP2's own default for a root).
    Where a call of the head gathers its weights by itself the per-rank call counts would
    pair unequal collectives across ranks: FSDP2 with the head in a group of its own,
    FSDP1's flat parameters, DeepSpeed ZeRO-3. Returns
    that reason in words, and the caller then lets the model's forward run the head.
    """
    head = output_embedding(model)
    if any(is_zero3_partitioned(p) for p in head.parameters()):
        return "DeepSpeed ZeRO-3 gathers the output embedding's weights at each call"
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return "FSDP1 shards the output embedding in flat parameters"
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]  # pre-order: the root first
    if not units:
        return None
    owners = [m for m in units if any(sub is head for sub in m.modules())]  # outermost first
    if not owners:
        return None  # the head's weights are not sharded
    if owners[-1] is not units[0]:
        return "FSDP2 shards the output embedding as a unit of its own"
    units[0].set_reshard_after_forward(False, recurse=False)
    return None
