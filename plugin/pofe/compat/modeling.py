"""transformers' models: the attention implementation, the KV cache, gradient checkpointing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pofe.compat.registry import entry


@entry(
    reaches="transformers: PretrainedConfig._attn_implementation, the attention backend a model runs",
    names=("_attn_implementation",),
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="transformers exposes the resolved attention implementation publicly",
)
def attn_implementation(config) -> str | None:
    """The attention backend of a model's config ("eager", "sdpa", "flash_attention_2", ...)."""
    return getattr(config, "_attn_implementation", None)


@entry(
    reaches="transformers: cache_utils.DynamicLayer's state (keys, values, dtype, device, is_initialized), "
    "which only its lazy_initialization sets",
    names=(),  # its fields' names (keys, values, ...) are everyday words
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="a cache layer can be built from given keys and values through a public constructor",
)
def fill_cache_layer(layer, keys, values) -> None:
    """Make `layer` (a DynamicLayer) hold `keys` and `values` as they are, initialised."""
    layer.dtype, layer.device = keys.dtype, keys.device
    layer.keys, layer.values = keys, values
    layer.is_initialized = True


@entry(
    reaches="transformers: GradientCheckpointingLayer._can_checkpoint_with_cache, without which a checkpointed "
    "layer drops past_key_values",
    names=("_can_checkpoint_with_cache",),
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="transformers lets a caller keep the cache under checkpointing (a forward argument or config)",
)
@contextmanager
def cache_kept_under_checkpointing(model) -> Iterator[None]:
    """Let `model`'s checkpointed decoder layers keep `past_key_values` for the duration: set on
    the instances, restored after. Its docstring reserves the flag for layers whose replay reads
    the same states, as POFE's prefix caches are (`pofe.prefix_cache`)."""
    layers = [m for m in model.modules() if hasattr(m, "_can_checkpoint_with_cache")]
    before = [m.__dict__.get("_can_checkpoint_with_cache") for m in layers]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m, value in zip(layers, before):
            if value is None:
                del m._can_checkpoint_with_cache
            else:
                m._can_checkpoint_with_cache = value


@entry(
    reaches="transformers: PreTrainedModel._gradient_checkpointing_func, the partial of torch's checkpoint "
    "that gradient_checkpointing_enable sets on each layer (its use_reentrant keyword)",
    names=("_gradient_checkpointing_func",),
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="transformers records the checkpointing kwargs publicly on the model",
)
def reentrant_checkpointing(model) -> bool:
    """True when the model's layers are checkpointed with `use_reentrant=True` (or do not say)."""
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) is True:
            func = getattr(m, "_gradient_checkpointing_func", None)
            keywords = getattr(func, "keywords", {}) or {}
            if keywords.get("use_reentrant", True):  # unsaid (a custom function): assume the worst
                return True
    return False
