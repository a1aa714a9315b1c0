"""bitsandbytes' 4-bit layers on the CPU."""

from __future__ import annotations

from pofe.compat.registry import entry


@entry(
    reaches="bitsandbytes: QuantState.packing_format_for_cpu, set when Linear4bit repacked its weight for the "
    "fused CPU inference kernel",
    names=("packing_format_for_cpu",),
    written_for="bitsandbytes 0.50.2 (both legs)",
    goes_when="bitsandbytes' CPU inference path stops repacking a layer's weight in place",
)
def packed_for_cpu_inference(module) -> bool:
    """True when a 4-bit layer's weight is in bitsandbytes' fused CPU inference layout."""
    quant_state = getattr(getattr(module, "weight", None), "quant_state", None)
    return bool(getattr(quant_state, "packing_format_for_cpu", False))


@entry(
    reaches="bitsandbytes: Linear4bit.support_avx512bf16_for_cpu (lets an eval-mode no-grad forward repack the "
    "weight, which later forwards keep, with no gradient to the input) and "
    "functional._convert_weight_packed_for_cpu_inverse",
    names=("support_avx512bf16_for_cpu", "_convert_weight_packed_for_cpu_inverse"),
    written_for="bitsandbytes 0.50.2 (both legs), on CPUs with AVX512-BF16",
    goes_when="bitsandbytes leaves a trainable layer in its training layout after an eval-mode pass",
)
def keep_4bit_layer_trainable(module) -> bool | None:
    """None when `module` is no bitsandbytes 4-bit layer; else its CPU inference repacking is
    switched off for good, and the return says whether an earlier pass had packed it (it is
    unpacked)."""
    if not hasattr(module, "support_avx512bf16_for_cpu"):
        return None
    module.support_avx512bf16_for_cpu = False
    if not packed_for_cpu_inference(module):
        return False
    from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

    weight = module.weight
    weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(weight.data, weight.quant_state)
    return True
