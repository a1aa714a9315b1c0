"""A tiny random Llama and a character-level tokenizer, built offline.

The toy world needs a model that loads "like a hub model" (`from_pretrained(path)`)
without any download: tests, recipes and the vLLM CPU server all point at the folder
`build_tiny_model` writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "<|end|>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# `<unk>` is not part of the chat format: it only keeps non-ASCII input from crashing
# the tokenizer (WordLevel needs an unknown token to map characters outside the vocab).
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
CHARS = "\n" + "".join(chr(c) for c in range(0x20, 0x7F))  # printable ASCII + newline

# Each message is `<|role|>content<|end|>`; no BOS is prepended (like Qwen), so the
# rendered text is exactly the concatenation of the turns.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, special tokens first (ids 0..6), decoded by concatenation."""
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Split into single characters (`[\s\S]` also matches newline); Fuse joins them back
    # without inserting spaces, so decode(encode(s)) == s.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
        # The default cleanup would drop the space in "a ." and break the round trip.
        clean_up_tokenization_spaces=False,
    )


def build_config(tokenizer: PreTrainedTokenizerFast, *, hidden_size: int, num_layers: int) -> LlamaConfig:
    """Two heads so head_dim = hidden_size / 2 (64 by default): vLLM's CPU attention rejects 16."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_tiny_model(path: str | Path, *, hidden_size: int = 128, num_layers: int = 2, seed: int = 0) -> Path:
    """Write a random-init `LlamaForCausalLM` and its tokenizer to `path`; return the path.

    The same seed gives the same weights; the caller's global RNG state is left untouched.
    """
    path = Path(path)
    tokenizer = build_tokenizer()
    config = build_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def is_tiny_model(path: str | Path) -> bool:
    """Whether a folder holds a model `build_tiny_model` wrote, trained since or not: a Llama of the
    character vocabulary (any other model is a user's)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") == "llama" and config.get("vocab_size") == len(SPECIAL_TOKENS) + len(CHARS)
