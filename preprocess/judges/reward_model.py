"""Reward-model judge: a sequence classifier with one output (e.g. a Bradley-Terry RM).

Each (prompt, response) is rendered with the REWARD MODEL's own chat template when it has
one (it was trained on that format, not the policy's); otherwise the two texts are passed as
a sentence pair (the DeBERTa-style reward models' format). Scores are logits[:, 0].
"""

from __future__ import annotations

import math

import torch

from ..render import Prompt, as_messages, prompt_text
from .base import JudgeStats, Score


class RewardModelJudge:
    def __init__(
        self, model_path: str, *, batch_size: int = 8, max_length: int = 1024, device: str | None = None,
        allow_abstain: bool = True,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForSequenceClassification.from_pretrained(model_path).to(self.device).eval()
        if self.model.config.pad_token_id is None:
            # Decoder classifiers pool at the last non-pad token: they must know the pad id.
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size
        self.max_length = max_length
        self.allow_abstain = allow_abstain
        self.stats = JudgeStats()

    def encode(self, prompt: Prompt, response: str) -> dict:
        """Token ids for one pair (no padding): the reward model's own input format."""
        kw = dict(truncation=True, max_length=self.max_length)
        if getattr(self.tokenizer, "chat_template", None):
            msgs = as_messages(prompt) + [{"role": "assistant", "content": response}]
            text = self.tokenizer.apply_chat_template(msgs, tokenize=False)
            return self.tokenizer(text, add_special_tokens=False, **kw)
        return self.tokenizer(prompt_text(prompt), response, **kw)

    @torch.no_grad()
    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        flat = [(p, r) for p, rs in zip(prompts, responses, strict=True) for r in rs]
        scores: list[float] = []
        for start in range(0, len(flat), self.batch_size):
            encs = [self.encode(p, r) for p, r in flat[start : start + self.batch_size]]
            batch = self.tokenizer.pad(encs, return_tensors="pt").to(self.device)
            logits = self.model(**batch).logits  # (b, num_labels)
            scores.extend(logits[:, 0].float().tolist())
            self.stats.count_call(len(encs))
        out: list[list[Score]] = []
        i = 0
        for p, rs in enumerate(responses):
            row: list[Score] = []
            for k, v in enumerate(scores[i : i + len(rs)]):
                # A NaN/inf score (e.g. an fp16 overflow) must not become a training target.
                row.append(v if math.isfinite(v) else self.stats.abstain(
                    f"non-finite score: {v}", allow=self.allow_abstain, where=f"candidate {k} (reward model)", prompt=p))
            out.append(row)
            i += len(rs)
        return out
