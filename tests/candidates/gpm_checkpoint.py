"""A tiny random GPM checkpoint in the authors' layout (general-preference/general-preference-model),
for the GPM judge's tests and benchmarks/gpm.py.

The layout their loader reads (`gpm_example_usage.py`): the base model's config.json and
tokenizer (here the toy world's tiny Llama and chat tokenizer, `pofe.demo.tiny`), and the
causal LM's state dict (`model.*`, `lm_head.weight`) with `value_head.weight` (2k, hidden) and,
optionally, `prompt_head.weight` (k, hidden) beside it, in safetensors: one `model.safetensors`,
or two shards and `model.safetensors.index.json` as the published GPM-Llama-3.1-8B is stored
(the backbone in one, the heads in the other). Nothing in config.json says 2k or whether a
prompt head exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def write_gpm_checkpoint(
    path: Path,
    *,
    hidden: int = 32,
    value_dim: int = 6,
    prompt_head: bool = True,
    shards: bool = False,
    seed: int = 0,
) -> Path:
    """Write the checkpoint to `path` (created); the heads are N(0, 1), so embeddings point in
    varied directions and the prompt head's softmax is far from uniform."""
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from pofe.demo.tiny import build_config, build_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer, hidden_size=hidden, num_layers=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        state = {k: v.contiguous() for k, v in LlamaForCausalLM(config).state_dict().items()}
        heads = {"value_head.weight": torch.randn(value_dim, hidden)}
        if prompt_head:
            heads["prompt_head.weight"] = torch.randn(value_dim // 2, hidden)
    state |= heads
    if shards:
        files = {"model-00001-of-00002.safetensors": [k for k in state if k.startswith("model.")]}
        files["model-00002-of-00002.safetensors"] = [k for k in state if not k.startswith("model.")]
        for name, keys in files.items():
            save_file({k: state[k] for k in keys}, str(path / name), metadata={"format": "pt"})
        index = {
            "metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
            "weight_map": {k: name for name, keys in files.items() for k in keys},
        }
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    else:
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
