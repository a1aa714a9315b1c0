"""QLoRA gradients are the same with or without a no-grad eval pass before training.

bitsandbytes 0.50 on AVX512-BF16 CPUs repacks 4-bit weights on such a pass and then
gives adapters behind 4-bit layers no gradient (see `pofe.quantization`). On CPUs
without that instruction set nothing is repacked and the equalities hold trivially; on
those with it, they fail without `keep_4bit_trainable`.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("bitsandbytes")


def _qlora(path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_use_double_quant=True,
    )
    model = AutoModelForCausalLM.from_pretrained(
        path, quantization_config=quant, dtype=torch.float32, attn_implementation="eager"
    )
    torch.manual_seed(0)  # the same random (non-zero) adapters in every model built here
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"], init_lora_weights=False
    )
    return get_peft_model(model, lora)


def _adapter_grads(model, ids):
    model.train()
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_no_grad_pass_leaves_qlora_gradients_intact(tiny64_model, one_torch_thread):
    from pofe.compat.quantization import packed_for_cpu_inference
    from pofe.quantization import keep_4bit_trainable

    ids = torch.randint(5, 60, (2, 12), generator=torch.Generator().manual_seed(1))
    reference = _adapter_grads(_qlora(tiny64_model), ids)
    assert len(reference) == 16 and all(g is not None for g in reference.values())

    model = _qlora(tiny64_model)
    assert keep_4bit_trainable(model) == 0  # nothing packed yet
    model.eval()
    with torch.no_grad():  # the anchor pass's conditions
        model(input_ids=ids)
    assert not any(packed_for_cpu_inference(m) for m in model.modules())
    grads = _adapter_grads(model, ids)
    for name, ref in reference.items():
        assert grads[name] is not None, name
        torch.testing.assert_close(grads[name], ref, rtol=0, atol=0, msg=name)


def test_layers_packed_earlier_are_unpacked(tiny64_model, one_torch_thread):
    """A model some earlier pass packed (forced here, whatever the CPU) trains like a fresh one."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    from pofe.compat.quantization import packed_for_cpu_inference
    from pofe.quantization import keep_4bit_trainable

    ids = torch.randint(5, 60, (2, 12), generator=torch.Generator().manual_seed(1))
    reference = _adapter_grads(_qlora(tiny64_model), ids)
    model = _qlora(tiny64_model)
    layers = [m for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    for m in layers:
        m.weight.data, m.weight.quant_state = _convert_weight_packed_for_cpu(m.weight.data, m.weight.quant_state)
    assert keep_4bit_trainable(model) == len(layers) == 14  # 7 projections x 2 layers
    assert not any(packed_for_cpu_inference(m) for m in layers)
    grads = _adapter_grads(model, ids)
    for name, ref in reference.items():
        # the weights come back bit-equal, but bitsandbytes re-quantises the double-quantised
        # absmax on unpacking: measured within 0.7 % of each gradient's largest entry (packed
        # and not unpacked: no gradient at all for q/v, up to 129 % off for the others)
        assert (grads[name] - ref).abs().max() <= 0.02 * ref.abs().max(), name
