"""The few facts POFE reads off a (possibly wrapped) transformers model.

Models reach POFE bare, or wrapped by PEFT, DDP, DeepSpeed or FSDP; these helpers look
through the wrappers. This module is a leaf: it imports torch only.
"""

from __future__ import annotations

import torch

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
    """transformers' `config._attn_implementation` ("eager", "sdpa", "flash_attention_2", ...)."""
    return getattr(model_config(model), "_attn_implementation", None) or "sdpa"


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
