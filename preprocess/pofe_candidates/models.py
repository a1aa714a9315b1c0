"""The one policy and tokenizer loader: a model folder, a hub id, or a PEFT adapter on its base.

Shared by the candidate pipeline's transformers backend, the trainers' pi_0, online sampling,
evaluation and the demo, so every place that loads a policy loads it the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def load_policy(path: str, *, device=None, dtype=None, quantization=None) -> torch.nn.Module:
    """A full model folder or hub id, or a PEFT adapter folder on its base; eval mode.

    dtype defaults to float32 on CPU and bfloat16 on CUDA ("auto" keeps the checkpoint's);
    device defaults to cuda when available. `quantization`: a transformers quantization config
    (bitsandbytes' 4 or 8 bits), the weights then quantised as they load onto `device`.
    """
    from transformers import AutoModelForCausalLM

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    # a quantised model is placed as it loads (bitsandbytes refuses `.to` on it)
    placed = {"quantization_config": quantization, "device_map": {"": device}} if quantization else {}
    if (Path(path) / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM  # only adapter folders need peft

        model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype, **placed)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **placed)
    return (model if quantization else model.to(device)).eval()


def load_tokenizer(path: str):
    """The policy's tokenizer; an adapter folder without tokenizer files uses its base model's.

    pad_token falls back to eos_token (batched generation needs one; the attention mask
    keeps it out of every result).
    """
    from transformers import AutoTokenizer

    folder = Path(path)
    adapter_config = folder / "adapter_config.json"
    if adapter_config.exists() and not (folder / "tokenizer_config.json").exists():
        path = json.loads(adapter_config.read_text())["base_model_name_or_path"]
    return with_pad_token(AutoTokenizer.from_pretrained(path))


def with_pad_token(tokenizer):
    """`tokenizer`, its pad_token set to eos_token if it has none."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
