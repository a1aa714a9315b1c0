"""The check's model: a random-init Llama and a tokenizer whose template writes BOS and which
adds BOS itself (Mistral v0.2 / Llama 2), the case where text prompts get two BOS.

The tokenizer is Mistral-7B v0.2's own sentencepiece model (mistral_common ships it, so nothing
is downloaded), as `tests/candidates/_real_tokenizers.py` converts it for issue 18's tests.
"""

from __future__ import annotations

from pathlib import Path

# TinyLlama-1.1B's shape (`benchmarks.run.MODELS["1b"]`) on Mistral's 32,000-token vocabulary;
# tiny: head_dim 64, which vLLM's CPU attention takes
SHAPES = {
    "1b": dict(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4
    ),
    "tiny": dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2
    ),
}


def build_tokenizer():
    """Mistral v0.2's tokenizer (its template writes `<s>`, and it adds `<s>` too); `<unk>` pads."""
    from tests.candidates._real_tokenizers import build

    tokenizer = build("mistral")
    tokenizer.pad_token = tokenizer.unk_token
    return tokenizer


def bos_behaviour(tokenizer) -> dict:
    """Whether the template writes BOS and the tokenizer adds one: the two-BOS hazard is real."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    bos = tokenizer.bos_token_id
    return {
        "template_writes_bos": text.startswith(tokenizer.bos_token),
        "tokenizer_adds_bos": tokenizer("hi").input_ids[:1] == [bos],
        "text_prompt_bos_count": tokenizer(text).input_ids[:2].count(bos),
    }


def build_model(path: Path, tokenizer, shape: str, dtype: str, seed: int = 0) -> Path:
    """Save a random-init Llama of `shape` in `dtype` with `tokenizer` at `path` (kept if there)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return path
    config = LlamaConfig(
        **SHAPES[shape],
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):  # a 1B model initialised on the CPU first is slow
            model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
