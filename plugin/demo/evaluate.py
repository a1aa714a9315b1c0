"""Greedy evaluation of a (possibly LoRA-adapted) model on the toy addition task."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from pofe.demo.task import reward


def load_model(model_dir: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a full model or, when `adapter_config.json` is present, a peft adapter on its base.

    The tokenizer comes from `model_dir` when saved there (axolotl saves it beside the
    adapter), else from the adapter's base model.
    """
    model_dir = Path(model_dir)
    adapter_config = model_dir / "adapter_config.json"
    if adapter_config.exists():
        from peft import AutoPeftModelForCausalLM  # only adapter folders need peft

        model = AutoPeftModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        base = json.loads(adapter_config.read_text())["base_model_name_or_path"]
        tokenizer_dir = model_dir if (model_dir / "tokenizer_config.json").exists() else base
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tokenizer_dir = model_dir
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return model.eval(), tokenizer


def _render(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """The prompt as one user turn followed by the assistant header."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _decode_until_eos(tokenizer: PreTrainedTokenizerBase, new_ids: list[int]) -> str:
    """Decode generated ids up to (not including) the first EOS.

    Other special tokens stay in the text, so a stray `<|user|>` makes the answer wrong
    instead of being silently dropped.
    """
    if tokenizer.eos_token_id in new_ids:
        new_ids = new_ids[: new_ids.index(tokenizer.eos_token_id)]
    return tokenizer.decode(new_ids, skip_special_tokens=False)


@torch.no_grad()
def generate_greedy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int,
    batch_size: int,
) -> list[str]:
    """Greedy responses for `prompts`, in order."""
    responses = []
    for start in range(0, len(prompts), batch_size):
        texts = [_render(tokenizer, p) for p in prompts[start : start + batch_size]]
        # Left padding: every row of a decoder-only batch must end at its last prompt token.
        batch = tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        )
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        new_tokens = out[:, batch["input_ids"].shape[1] :]  # (B, <= max_new_tokens)
        responses += [_decode_until_eos(tokenizer, row.tolist()) for row in new_tokens]
    return responses


def greedy_reward(
    model_dir: str | Path, prompts: list[str], *, max_new_tokens: int = 6, batch_size: int = 32
) -> dict:
    """Mean reward and exact-match rate of greedy answers to `prompts`.

    Returns `{"mean_reward": float, "exact_match": float,
    "samples": [(prompt, response, reward), ...]}`; exact match means reward 1.0.
    """
    if not prompts:
        raise ValueError("greedy_reward needs at least one prompt")
    model, tokenizer = load_model(model_dir)
    responses = generate_greedy(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    samples = [(p, r, reward(p, r)) for p, r in zip(prompts, responses, strict=True)]
    scores = [s for _, _, s in samples]
    return {
        "mean_reward": sum(scores) / len(scores),
        "exact_match": sum(s == 1.0 for s in scores) / len(scores),
        "samples": samples,
    }
