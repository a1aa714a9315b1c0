"""Reward-model judge: a sequence classifier (e.g. a Bradley-Terry RM), or a custom model.

Each (prompt, response) is rendered with the REWARD MODEL's own chat template when it has
one (it was trained on that format, not the policy's); otherwise the two texts are passed as
a sentence pair (the DeBERTa-style reward models' format). Scores are
`output.<score_output>[:, score_index]`: logits[:, 0] by default; a multi-objective model
picks one objective by index, or, with its own code (`trust_remote_code`), the field holding
its aggregate (e.g. `score`). The weights load in `dtype` (auto: the checkpoint's) and are
placed by `device_map` (transformers', via accelerate) or on one device.

An input longer than `max_length` keeps its response whole and loses the start of its prompt
(`left_cut`): the text nearest the response matters most to its reward, and a right cut would
score the prompt alone. The leading BOS the template writes survives the cut (a decoder
reward model always saw one at position 0). Such scores are `PromptCut`s, counted per row in
the judge shards and in summary.json (`judge_prompts_cut`). A response that cannot fit even
with no prompt left is not scored: the judge abstains (counted, `RESPONSE_TOO_LONG`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pofe.batching import length_sorted_batches
from pofe.logs import logger_name
from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges.interface import JudgeStats, PromptCut, Score
from pofe_candidates.judges.shared_prefix import common_prefix, prefix_shared_forwards, reads_causally
from pofe_candidates.render import Prompt, as_messages, prompt_text

LOG = logging.getLogger(logger_name(__name__))
# an abstention's reason starts with this (its kind in summary.json's judge_abstention_reasons)
RESPONSE_TOO_LONG = "response longer than judge.max_length"


@dataclass(frozen=True)
class Encoded:
    """One pair's model inputs (None: the response alone exceeds max_length), the prompt tokens
    cut from the left to fit, and the tokens the response side needs (with the template's)."""

    inputs: dict | None
    prompt_cut: int = 0
    response_tokens: int = 0


def left_cut(ids: list[int], response_start: int, max_length: int, keep_first: int) -> list[int] | None:
    """`ids` within `max_length` by dropping prompt tokens from the left: the first `keep_first`
    (BOS) and everything from `response_start` on are kept, then as much of the prompt's end as
    fits. None when the kept parts alone exceed `max_length`."""
    if len(ids) <= max_length:
        return ids
    if keep_first + len(ids) - response_start > max_length:
        return None
    return ids[:keep_first] + ids[len(ids) - (max_length - keep_first) :]


def _inputs(ids: list[int]) -> dict:
    return {"input_ids": ids, "attention_mask": [1] * len(ids)}


class RewardModelJudge:
    # the dataset's prompt: the reward model renders it with its own chat template (`encode`)
    reads_rendered_prompt = False
    reads_columns = False

    def __init__(
        self,
        model_path: str,
        *,
        batch_size: int = 8,
        max_length: int = 1024,
        allow_abstain: bool = True,
        dtype: str = "auto",
        device_map: str | dict | None = None,
        trust_remote_code: bool = False,
        score_output: str = "logits",
        score_index: int = 0,
        prefix_sharing: bool = True,
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
        # only a sentence pair is truncated by the tokenizer: its prompt, from the left (encode)
        self.tokenizer.truncation_side = "left"
        self.score_output, self.score_index = score_output, score_index
        if getattr(self.model.config, "pad_token_id", None) is None:
            # Decoder classifiers pool at the last non-pad token: they must know the pad id.
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size
        self.max_length = max_length
        # a bidirectional encoder reads the prompt in the light of the response: nothing to share
        self.shares_prefix = (
            prefix_sharing
            and bool(getattr(self.tokenizer, "chat_template", None))
            and reads_causally(self.model.config)
        )
        self.allow_abstain = allow_abstain
        self.stats = JudgeStats()
        self._warned = False  # the prompt-cut warning, once per judge

    @classmethod
    def from_config(cls, cfg: JudgeConfig) -> RewardModelJudge:
        return cls(
            cfg.model,
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
            allow_abstain=cfg.allow_abstain,
            dtype=cfg.dtype,
            device_map=cfg.device_map,
            trust_remote_code=cfg.trust_remote_code,
            score_output=cfg.score_output,
            score_index=cfg.score_index,
            prefix_sharing=cfg.prefix_sharing,
        )

    def encode(self, prompt: Prompt, response: str) -> Encoded:
        """Token ids for one pair (no padding), in the reward model's own input format, cut to
        max_length from the prompt's left (module docstring)."""
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return self._encode_pair(prompt_text(prompt), response)
        msgs = as_messages(prompt)
        text = tok.apply_chat_template(msgs + [{"role": "assistant", "content": response}], tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.max_length:
            return Encoded(_inputs(ids))
        # the response side: whatever follows the prompt's own rendering (its generation prompt)
        head = tok(
            tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False
        )["input_ids"]
        keep_first = 1 if tok.bos_token_id is not None and ids[0] == tok.bos_token_id else 0
        start = max(common_prefix(ids, head), keep_first)
        cut = left_cut(ids, start, self.max_length, keep_first)
        if cut is None:
            return Encoded(None, response_tokens=len(ids) - start)
        return Encoded(_inputs(cut), prompt_cut=len(ids) - len(cut), response_tokens=len(ids) - start)

    def encode_all(self, pairs: list[tuple[Prompt, str]]) -> list[Encoded]:
        """`encode` of every (prompt, response), the tokenizer called once for all of them (a
        call per pair costs more than the tokenising); only inputs over max_length take
        `encode`'s own path, which cuts them."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            texts = [
                tok.apply_chat_template(as_messages(p) + [{"role": "assistant", "content": r}], tokenize=False)
                for p, r in pairs
            ]
            ids = tok(texts, add_special_tokens=False)["input_ids"] if texts else []
            whole = [Encoded(_inputs(i)) for i in ids]
        else:
            enc = tok([prompt_text(p) for p, _ in pairs], [r for _, r in pairs]) if pairs else {"input_ids": []}
            whole = [Encoded({k: v[n] for k, v in enc.items()}) for n in range(len(enc["input_ids"]))]
        return [
            e if len(e.inputs["input_ids"]) <= self.max_length else self.encode(*pair)
            for e, pair in zip(whole, pairs, strict=True)
        ]

    def _encode_pair(self, prompt: str, response: str) -> Encoded:
        """A sentence pair (no chat template): the tokenizer's own left truncation of the
        prompt (`only_first`), its special tokens added after the cut."""
        tok = self.tokenizer
        full = tok(prompt, response)
        if len(full["input_ids"]) <= self.max_length:
            return Encoded(dict(full))
        need = len(tok(response, add_special_tokens=False)["input_ids"]) + tok.num_special_tokens_to_add(pair=True)
        if need >= self.max_length:  # at least one prompt token stays: `only_first` needs one
            return Encoded(None, response_tokens=need)
        enc = tok(prompt, response, truncation="only_first", max_length=self.max_length)
        return Encoded(dict(enc), prompt_cut=len(full["input_ids"]) - len(enc["input_ids"]), response_tokens=need)

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
        encoded = self.encode_all(flat)
        values: dict[int, float] = {}
        forwards = self._shared_forwards(encoded, responses) if self.shares_prefix else self._whole_forwards(encoded)
        for chunk, output in forwards:
            values.update(zip(chunk, self.pick_scores(output).float().tolist()))
            self.stats.count_call(len(chunk))
        if any(e.prompt_cut for e in encoded) and not self._warned:
            self._warned = True
            LOG.warning(
                f"POFE: reward-model inputs longer than judge.max_length={self.max_length} tokens are scored "
                "with their prompt cut from the left (each response kept whole); counted in summary.json "
                "(judge_prompts_cut). Raise judge.max_length to score whole conversations."
            )
        out: list[list[Score]] = []
        n = 0
        for p, rs in enumerate(responses):
            out.append([self._verdict(encoded[n + k], values.get(n + k), p, k) for k in range(len(rs))])
            n += len(rs)
        return out

    def _whole_forwards(self, encoded: list[Encoded]) -> Iterator[tuple[list[int], object]]:
        """Every scored input whole, in length-sorted batches: padding is masked, so a score
        depends on its batch only through rounding. Yields (flat indices, model output)."""
        live = [n for n, e in enumerate(encoded) if e.inputs is not None]
        for sorted_batch in length_sorted_batches(
            [len(encoded[n].inputs["input_ids"]) for n in live], self.batch_size
        ):
            chunk = [live[m] for m in sorted_batch]
            batch = self.tokenizer.pad([encoded[n].inputs for n in chunk], return_tensors="pt").to(self.device)
            yield chunk, self.model(**batch)

    def _shared_forwards(
        self, encoded: list[Encoded], responses: list[list[str]]
    ) -> Iterator[tuple[list[int], object]]:
        """Each prompt's shared tokens run once for its candidates (`shared_prefix`)."""
        groups, start = [], 0
        for rs in responses:
            groups.append(
                [
                    (n, encoded[n].inputs["input_ids"])
                    for n in range(start, start + len(rs))
                    if encoded[n].inputs is not None
                ]
            )
            start += len(rs)
        return prefix_shared_forwards(
            self.model,
            groups,
            batch_size=self.batch_size,
            window_tokens=self.batch_size * self.max_length,
            pad_id=self.model.config.pad_token_id,
            device=self.device,
            remedy="its attention keeps its own cache; set judge.prefix_sharing: false",
        )

    def _verdict(self, enc: Encoded, value: float | None, p: int, k: int) -> Score:
        where = f"candidate {k} (reward model)"
        if enc.inputs is None:
            return self.stats.abstain(
                f"{RESPONSE_TOO_LONG}: {enc.response_tokens} tokens with the template's, limit {self.max_length}",
                allow=self.allow_abstain,
                where=where,
                prompt=p,
            )
        # A NaN/inf score (e.g. an fp16 overflow) must not become a training target.
        if not math.isfinite(value):
            return self.stats.abstain(f"non-finite score: {value}", allow=self.allow_abstain, where=where, prompt=p)
        return PromptCut(value) if enc.prompt_cut else value
