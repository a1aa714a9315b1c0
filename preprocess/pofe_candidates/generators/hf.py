"""Transformers: the one generation loop, and the `transformers` backend.

`sample_responses` is shared by the candidate pipeline (through `TransformersGenerator`), the
run layer's evaluation, online Nash-MD's mixture and the demo, so every place that decodes from
a policy renders, pads, seeds and cuts responses the same way.

Slow next to vLLM, but always available, and the only backend with all three strategies:
sampling, beam search, and diverse beam search (POFE's own, see diverse_beam.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from pofe_candidates.config import Sampling
from pofe_candidates.generators.diverse_beam import diverse_beam_search
from pofe_candidates.generators.interface import Completion
from pofe_candidates.models import load_policy, load_tokenizer, with_pad_token
from pofe_candidates.render import Rendered, prompt_token_ids


@dataclass(frozen=True)
class Sample:
    """One response: ids stop at and include the first stop token; text decoded without
    special tokens; finish_reason "stop" (a stop token ended it) or "length" (max_new_tokens).
    `cut_at_user_turn`: evaluation cut it before a user turn it wrote (`pofe.run.evaluation.sampler`;
    its ids end there, with no stop token)."""

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    finish_reason: str
    cut_at_user_turn: bool = False


def stop_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a response: the model's `generation_config.eos_token_id` (chat
    models often list several, e.g. Llama 3's <|eot_id|> and <|end_of_text|>), then the
    tokenizer's eos_token_id if not among them."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


@torch.no_grad()
def sample_responses(
    model,
    tokenizer,
    prompts: list[str] | list[list[int]],
    n: int,
    sampling: Sampling,
    *,
    batch_size: int,
    progress: Callable[[int], object] | None = None,
    logits_processor_for: Callable[[torch.Tensor], object] | None = None,
) -> list[list[Sample]]:
    """P rendered prompts (strings, tokenised as the trainer does, or token ids) -> P lists of
    n Samples, for every `sampling.strategy`; `progress` gets each batch's prompt count as it ends.
    `logits_processor_for` (strategy `sample` only): called with each batch's prompt attention
    mask (B * n, P), left-padded, one row per sequence, it returns transformers logits processors
    for that batch, applied before the temperature, top-k and top-p (Nash-MD's mixture: a second
    model's logits, from a cache of its own per batch).

    Temperature 0 with strategy `sample` is greedy decoding (one response: n must be 1).
    Batch b is seeded with `sampling.seed + b` inside `torch.random.fork_rng`, so the same
    prompts, batch size and seed give the same responses for every model, and the caller's
    global RNG is left untouched.
    """
    if sampling.strategy == "sample" and sampling.temperature == 0.0 and n != 1:
        raise ValueError(f"temperature 0 (greedy) gives one response per prompt, asked for n={n}")
    device = next(model.parameters()).device
    ids = [p if isinstance(p, list) else prompt_token_ids(tokenizer, p) for p in prompts]
    stops = stop_token_ids(model, tokenizer)
    out: list[list[Sample]] = []
    for b, start in enumerate(range(0, len(ids), batch_size)):
        # Left padding: every row of a decoder-only batch must end at its last prompt token.
        enc = tokenizer.pad(
            {"input_ids": ids[start : start + batch_size]}, padding=True, padding_side="left", return_tensors="pt"
        ).to(device)
        extra = {}
        if logits_processor_for is not None:
            extra["logits_processor"] = logits_processor_for(enc["attention_mask"].repeat_interleave(n, dim=0))
        with _seeded(sampling.seed + b):
            new = _generate(model, tokenizer, enc, n, sampling, stops, **extra)  # (B * n, T)
        out.extend(_to_samples(tokenizer, enc, new.tolist(), n, stops))
        if progress is not None:
            progress(len(enc["input_ids"]))
    return out


@contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
        torch.manual_seed(seed)
        yield


def _generate(model, tokenizer, enc, n: int, s: Sampling, stops: list[int], logits_processor=None) -> torch.Tensor:
    """New token ids (B * n, T), prompt-major; rows that stopped early end in padding."""
    prompt_len = enc["input_ids"].shape[1]
    common = dict(max_new_tokens=s.max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=stops)
    if logits_processor is not None:
        if s.strategy != "sample" or s.temperature == 0.0:
            raise ValueError("logits processors are applied when sampling only (strategy sample, temperature > 0)")
        common["logits_processor"] = logits_processor
    if s.strategy == "sample":
        if s.temperature == 0.0:
            seqs = model.generate(**enc, do_sample=False, num_beams=1, **common)
        else:
            seqs = model.generate(
                **enc,
                do_sample=True,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,  # 0 disables top-k (transformers' default would be 50)
                num_return_sequences=n,
                **common,
            )  # (B * n, prompt_len + T)
        return seqs[:, prompt_len:]
    if s.strategy == "beam":
        seqs = model.generate(**enc, do_sample=False, num_beams=n, num_return_sequences=n, top_k=None, **common)
        return seqs[:, prompt_len:]
    if s.strategy == "diverse_beam":
        return diverse_beam_search(model, enc, n, s.num_beam_groups, s.diversity_penalty, **common)
    raise ValueError(f"unknown generate.strategy {s.strategy!r}")


def _to_samples(tokenizer, enc, new: list[list[int]], n: int, stops: list[int]) -> list[list[Sample]]:
    pad, stop_set = tokenizer.pad_token_id, set(stops)
    out = []
    for i in range(len(new) // n):
        prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        row = []
        for ids in new[i * n : (i + 1) * n]:
            end = next((t for t, tok in enumerate(ids) if tok in stop_set), None)
            if end is not None:
                ids, reason = ids[: end + 1], "stop"
            else:
                # the pad token may be a stop token (pad = eos fallback): then it was found above
                while ids and ids[-1] == pad:  # only padding follows a finished response
                    ids = ids[:-1]
                reason = "length"
            text = tokenizer.decode([t for t in ids if t not in stop_set], skip_special_tokens=True)
            row.append(Sample(prompt_ids, ids, text, reason))
        out.append(row)
    return out


class TransformersGenerator:
    """Generate candidates with a local causal LM through `sample_responses`.

    Reproducibility: batch b of a call is seeded with `sampling.seed + b`, so the same
    prompts, batch size and seed give the same candidates. The model keeps its checkpoint's
    dtype (dtype="auto").
    """

    name = "transformers"

    def __init__(
        self, model_path: str, *, batch_size: int = 8, device: str | None = None, dtype="auto", tokenizer=None
    ):
        # the caller's tokenizer when given (axolotl's load_tokenizer: the one training uses)
        self.tokenizer = with_pad_token(tokenizer) if tokenizer is not None else load_tokenizer(model_path)
        self.model = load_policy(model_path, device=device, dtype=dtype)
        self.batch_size = batch_size

    @classmethod
    def of_model(cls, model, tokenizer, *, batch_size: int = 8) -> TransformersGenerator:
        """A backend over a model already in memory (online training samples with the policy it
        trains); `close()` leaves the model to its owner."""
        generator = cls.__new__(cls)
        generator.model, generator.tokenizer, generator.batch_size = model, with_pad_token(tokenizer), batch_size
        return generator

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[Completion]]:
        """prompts: P rendered prompts (generated from their ids) -> P lists of n candidates."""
        greedy = sampling.strategy == "sample" and sampling.temperature == 0.0
        samples = sample_responses(
            self.model,
            self.tokenizer,
            [list(p.ids) for p in prompts],
            1 if greedy else n,
            sampling,
            batch_size=self.batch_size,
        )
        if greedy:  # one decode, n copies (dedupe drops them later)
            samples = [[row[0]] * n for row in samples]
        return [[Completion(s.text, s.finish_reason, s.response_ids) for s in row] for row in samples]

    def close(self) -> None:
        """Drop the model (the pipeline frees its memory before the judge loads)."""
        del self.model


__all__ = ["Sample", "sample_responses", "stop_token_ids", "TransformersGenerator"]
