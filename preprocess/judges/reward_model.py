"""Reward-model judge: a sequence classifier (e.g. a Bradley-Terry RM), or a custom model.

Each (prompt, response) is rendered with the REWARD MODEL's own chat template when it has
one (it was trained on that format, not the policy's); otherwise the two texts are passed as
a sentence pair (the DeBERTa-style reward models' format). Scores are
`output.<score_output>[:, score_index]`: logits[:, 0] by default; a multi-objective model
picks one objective by index, or, with its own code (`trust_remote_code`), the field holding
its aggregate (e.g. `score`). The weights load in `dtype` (auto: the checkpoint's) and are
placed by `device_map` (transformers', via accelerate) or on one device.
"""

from __future__ import annotations

import math

import torch

from ..render import Prompt, as_messages, prompt_text
from .base import JudgeStats, Score


class RewardModelJudge:
    # the dataset's prompt: the reward model renders it with its own chat template (`encode`)
    reads_rendered_prompt = False
    reads_columns = False

    def __init__(
        self, model_path: str, *, batch_size: int = 8, max_length: int = 1024, allow_abstain: bool = True,
        dtype: str = "auto", device_map: str | dict | None = None, trust_remote_code: bool = False,
        score_output: str = "logits", score_index: int = 0,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        remote = dict(trust_remote_code=trust_remote_code)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path, **remote)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model_path, dtype=dtype, device_map=device_map, **remote
            ).eval()
        except ValueError as e:
            if trust_remote_code or "trust_remote_code" not in str(e):
                raise
            raise ValueError(
                f"judge.model {model_path!r} needs its own Python code (its config's auto_map) to load. Read that "
                "code, then set judge.trust_remote_code: true to run it."
            ) from e
        if device_map is None:
            self.model.to("cuda" if torch.cuda.is_available() else "cpu")
        self.device = self.model.device  # inputs go where the first layers are
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.score_output, self.score_index = score_output, score_index
        if getattr(self.model.config, "pad_token_id", None) is None:
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

    def pick_scores(self, output) -> torch.Tensor:
        """output.<score_output>: (b,) or (b, n) -> (b,) column score_index; errors say what there is."""
        fields = [k for k, v in output.items() if isinstance(v, torch.Tensor)]
        if self.score_output not in fields:
            raise ValueError(
                f"judge.score_output: the reward model's output has no tensor {self.score_output!r}; it has "
                f"{fields}. Set judge.score_output to the field that holds the scores."
            )
        values = output[self.score_output]
        if values.dim() == 1:
            values = values[:, None]
        if values.dim() != 2 or not self.score_index < values.shape[1]:
            raise ValueError(
                f"judge.score_index {self.score_index}: the reward model's {self.score_output} has shape "
                f"{tuple(values.shape)}, expected (batch, n) with n > score_index."
            )
        return values[:, self.score_index]

    @torch.no_grad()
    def score(self, prompts: list[Prompt], responses: list[list[str]]) -> list[list[Score]]:
        flat = [(p, r) for p, rs in zip(prompts, responses, strict=True) for r in rs]
        scores: list[float] = []
        for start in range(0, len(flat), self.batch_size):
            encs = [self.encode(p, r) for p, r in flat[start : start + self.batch_size]]
            batch = self.tokenizer.pad(encs, return_tensors="pt").to(self.device)
            scores.extend(self.pick_scores(self.model(**batch)).float().tolist())
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
