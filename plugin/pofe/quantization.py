"""4-bit (QLoRA) layers that stay trainable after passes without gradients.

On a CPU with AVX512-BF16, bitsandbytes 0.50's `Linear4bit.forward`, called in eval mode
on an input that needs no gradient, repacks the layer's weight for a fused inference
kernel and leaves it packed. Every later forward, in
training too, then takes that kernel, which casts activations to bf16 and carries no
gradient to the layer's input: adapters behind a 4-bit layer get no gradient at all, the
others wrong ones. SPPO's anchor pass and any evaluation pass are such passes, and the
anchor's log-probs would come from a different kernel than the training forward's.

A model that trains must therefore never take that path: `keep_4bit_trainable` switches
it off on every 4-bit layer and restores any layer an earlier pass already packed (through
`pofe.compat.keep_4bit_layer_trainable`: bitsandbytes' own flag and unpacking).
"""

from __future__ import annotations

import torch

from pofe.compat.quantization import keep_4bit_layer_trainable
from pofe.logs import get_logger

LOG = get_logger(__name__)


def keep_4bit_trainable(model: torch.nn.Module) -> int:
    """Keep every bitsandbytes 4-bit layer of `model` in its training layout, for good.

    Returns how many layers were already packed (by an earlier no-grad eval pass) and
    have been unpacked; a model without 4-bit layers is left untouched.
    """
    restored = sum(keep_4bit_layer_trainable(module) is True for module in model.modules())
    if restored:
        LOG.warning(
            f"POFE: {restored} 4-bit layers had been repacked for bitsandbytes' CPU inference "
            "kernel (which carries no gradient) by an earlier no-grad pass; unpacked them"
        )
    return restored
