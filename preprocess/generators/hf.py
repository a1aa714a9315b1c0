"""Transformers backend: `model.generate` on the local machine (CPU or GPU).

Slow next to vLLM, but always available, and the only backend with all three strategies:
sampling, beam search, and diverse beam search (POFE's own, see diverse_beam.py).
"""

from __future__ import annotations

import torch

from .config import Sampling
from .diverse_beam import HammingDiversityProcessor


class TransformersGenerator:
    """Generate with a local causal LM.

    Reproducibility: each call seeds torch with `sampling.seed + batch_index` before each
    batch, so the same prompts, batch size and seed give the same candidates.
    """

    name = "transformers"

    def __init__(self, model_path: str, *, batch_size: int = 8, device: str | None = None, dtype=None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"  # decoder-only: new tokens follow the prompt directly
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype or "auto").to(self.device).eval()
        self.batch_size = batch_size
        # Prompts rendered with a chat template already carry BOS.
        self.add_special_tokens = not bool(getattr(self.tokenizer, "chat_template", None))

    @torch.no_grad()
    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[str]]:
        """prompts: P rendered strings -> P lists of n candidate strings."""
        out: list[list[str]] = []
        for b, start in enumerate(range(0, len(prompts), self.batch_size)):
            torch.manual_seed(sampling.seed + b)
            out.extend(self._batch(prompts[start : start + self.batch_size], n, sampling))
        return out

    def _batch(self, prompts: list[str], n: int, s: Sampling) -> list[list[str]]:
        enc = self.tokenizer(
            prompts, return_tensors="pt", padding=True, add_special_tokens=self.add_special_tokens
        ).to(self.device)
        prompt_len = enc["input_ids"].shape[1]
        common = dict(
            max_new_tokens=s.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        if s.strategy == "sample":
            if s.temperature == 0.0:  # greedy: one decode, n copies (dedupe drops them later)
                seqs = self.model.generate(**enc, do_sample=False, num_beams=1, **common)
                return [[t] * n for t in self._decode(seqs, prompt_len)]
            seqs = self.model.generate(
                **enc,
                do_sample=True,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,  # 0 disables top-k (transformers' default would be 50)
                num_return_sequences=n,
                **common,
            )  # (P * n, prompt_len + T)
            return _chunk(self._decode(seqs, prompt_len), n)
        if s.strategy == "beam":
            seqs = self.model.generate(
                **enc, do_sample=False, num_beams=n, num_return_sequences=n, top_k=None, **common
            )
            return _chunk(self._decode(seqs, prompt_len), n)
        if s.strategy == "diverse_beam":
            return self._diverse_beam(enc, prompt_len, n, s, common)
        raise ValueError(f"unknown generate.strategy {s.strategy!r}")

    def _diverse_beam(self, enc, prompt_len: int, n: int, s: Sampling, common: dict) -> list[list[str]]:
        g = s.num_beam_groups
        per_group = n // g
        num_prompts = enc["input_ids"].shape[0]
        previous = torch.full((num_prompts, 0, 0), -1, dtype=torch.long)  # (P, M, T)
        groups: list[list[list[str]]] = []
        for _ in range(g):
            proc = HammingDiversityProcessor(previous, prompt_len, per_group, s.diversity_penalty)
            seqs = self.model.generate(
                **enc,
                do_sample=False,
                num_beams=per_group,
                num_return_sequences=per_group,
                top_k=None,
                logits_processor=[proc],
                **common,
            )  # (P * per_group, prompt_len + T)
            new = seqs[:, prompt_len:].clone()
            new[new == self.tokenizer.pad_token_id] = -1  # padding after EOS never counts
            new = new.view(num_prompts, per_group, -1).cpu()
            previous = _cat_padded(previous, new)
            groups.append(_chunk(self._decode(seqs, prompt_len), per_group))
        # (G, P, per_group) -> (P, G * per_group), group-major within each prompt
        return [[c for grp in groups for c in grp[p]] for p in range(num_prompts)]

    def _decode(self, seqs: torch.Tensor, prompt_len: int) -> list[str]:
        return self.tokenizer.batch_decode(seqs[:, prompt_len:], skip_special_tokens=True)


def _chunk(flat: list[str], n: int) -> list[list[str]]:
    return [flat[i : i + n] for i in range(0, len(flat), n)]


def _cat_padded(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Concatenate (P, M1, T1) and (P, M2, T2) along M, right-padding time with -1."""
    t = max(a.shape[2], b.shape[2])
    pad = lambda x: torch.nn.functional.pad(x, (0, t - x.shape[2]), value=-1)  # noqa: E731
    return torch.cat([pad(a), pad(b)], dim=1)
