"""A model's size from its config.json, never downloading (`axolotl pofe plan`).

The config comes from a local directory or the Hugging Face hub cache
(`huggingface_hub.try_to_load_from_cache`); offline, a hub id not in the cache cannot be sized,
nor told gated or missing. The parameters are counted on an empty model (accelerate's
`init_empty_weights`, as `accelerate estimate-memory` builds one) with accelerate's
`calculate_maximum_sizes`; the shapes `pofe.run.plan.estimate` needs are read off the same model.
"""

from __future__ import annotations

import json
from pathlib import Path

from pofe.paths import is_hub_id
from pofe.run.plan.estimate import ModelSize

# how a model is built to be counted: with its language-model head, its classification head, or
# as the bare transformer (an encoder such as PairRM's DeBERTa, or a decoder whose head is not
# loaded: GPM reads the last hidden states); which a judge is, its type's spec says
KINDS = ("causal_lm", "sequence_classification", "encoder", "backbone")


def find_config(model: str) -> Path | None:
    """`model`'s config.json: in the directory it names, else in the hub cache; None if neither."""
    path = Path(model)
    if path.is_dir():
        return path / "config.json" if (path / "config.json").is_file() else None
    if path.exists() or not is_hub_id(model):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model, "config.json")
    return Path(found) if isinstance(found, str) else None  # else missing, or cached as absent


def pairrm_backbone(config: Path) -> str | None:
    """llm-blender's PairRM keeps a ranker config naming its DeBERTa backbone (`model_name`),
    whose config.json has the shapes; a DeBERTa-v2 config (PairRM-hf) is its own. None: the
    config is the model's own."""
    raw = json.loads(config.read_text())
    return raw.get("model_name") if "ranker_type" in raw else None


def model_size(config: Path, kind: str = "causal_lm") -> ModelSize:
    """Count the model `config` describes, built on the meta device (no memory, no weights)."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = {
        "causal_lm": AutoModelForCausalLM,
        "sequence_classification": AutoModelForSequenceClassification,
        "encoder": AutoModel,
        "backbone": AutoModel,
    }[kind]
    cfg = AutoConfig.from_pretrained(config.parent)
    dtype = _dtype_name(getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None))  # before from_config sets it
    with init_empty_weights():
        model = auto.from_config(cfg, dtype=torch.float32)
    total_bytes, _ = calculate_maximum_sizes(model)  # in float32: 4 bytes a tensor element
    # accelerate counts buffers too (the rotary inv_freq, not a weight of the checkpoint)
    total = int(total_bytes // 4) - sum(b.numel() for b in model.buffers())
    output = model.get_output_embeddings() if kind == "causal_lm" else None
    linears = tuple(
        (name, m.in_features, m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and m is not output
    )
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelSize(
        total=total,
        layer_linear=sum(i * o for _, i, o in linears),
        # DeepSpeed's `largest_layer_params`: the largest module's own parameters
        largest_layer=max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
        lora_linears=linears,
        hidden=text.hidden_size,
        layers=text.num_hidden_layers,
        intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
        kv_dim=(getattr(text, "num_key_value_heads", None) or heads) * head_dim,
        heads=heads,
        vocab=text.vocab_size,
        max_position=getattr(text, "max_position_embeddings", 0) or 0,
        dtype=dtype,
    )


def _dtype_name(dtype) -> str:
    name = str(dtype or "float32").removeprefix("torch.")
    return name if name in ("float32", "bfloat16", "float16") else "float32"
