"""Greedy evaluation of a (possibly LoRA-adapted) model on the toy addition task."""

from __future__ import annotations

from pathlib import Path

import torch

from pofe.demo.task import reward
from pofe_candidates.config import Sampling
from pofe_candidates.generators.hf import Sample, sample_responses
from pofe_candidates.models import load_policy, load_tokenizer
from pofe_candidates.render import render_prompt


def greedy_reward(model_dir: str | Path, prompts: list[str], *, max_new_tokens: int = 6, batch_size: int = 32) -> dict:
    """Mean reward and exact-match rate of greedy answers to `prompts`.

    The model (a full folder or a peft adapter on its base) runs on CPU in float32: the toy
    model is tiny, and its answers should not depend on the machine.
    Returns `{"mean_reward": float, "exact_match": float,
    "samples": [(prompt, response, reward), ...]}`; exact match means reward 1.0.
    """
    if not prompts:
        raise ValueError("greedy_reward needs at least one prompt")
    model = load_policy(str(model_dir), device="cpu", dtype=torch.float32)
    tokenizer = load_tokenizer(str(model_dir))
    rendered = [render_prompt(tokenizer, p).text for p in prompts]
    greedy = Sampling(temperature=0.0, max_new_tokens=max_new_tokens)
    answers = sample_responses(model, tokenizer, rendered, 1, greedy, batch_size=batch_size)
    responses = [_answer_text(tokenizer, sample) for (sample,) in answers]
    samples = [(p, r, reward(p, r)) for p, r in zip(prompts, responses, strict=True)]
    scores = [s for _, _, s in samples]
    return {
        "mean_reward": sum(scores) / len(scores),
        "exact_match": sum(s == 1.0 for s in scores) / len(scores),
        "samples": samples,
    }


def _answer_text(tokenizer, sample: Sample) -> str:
    """The response up to (not including) its EOS, other special tokens kept.

    A stray `<|user|>` then makes the answer wrong instead of being silently dropped.
    """
    ids = sample.response_ids
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)
