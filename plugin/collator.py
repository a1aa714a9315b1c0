"""Batch B prompts x k candidates (k may differ between prompts).

Only real candidates become sequences: N = sum_b k_b rows of `prompt + response`,
right-padded to the longest, with labels on response tokens only. `candidate_mask`
(B, K) with K = max_b k_b says where each flat row goes back: the rows are the True
entries of the mask in row-major order, so `x.new_zeros(B, K).masked_scatter(mask, flat)`
restores the (B, K) layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100

# Per-candidate float columns carried through as (B, K) tensors.
CANDIDATE_FLOATS = ("rewards", "win_rates", "anchor_logps")


@dataclass
class KResponseCollator:
    """Collator built by axolotl as `cls(tokenizer, padding=..., pad_to_multiple_of=...)`."""

    tokenizer: Any
    padding: bool | str = True
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        sequences, labels = [], []
        for f in features:
            prompt = list(f["prompt_ids"])
            for response in f["response_ids"]:
                sequences.append(prompt + list(response))
                labels.append([IGNORE_INDEX] * len(prompt) + list(response))

        length = max(len(s) for s in sequences)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        n = len(sequences)
        input_ids = torch.full((n, length), pad_id, dtype=torch.long)
        label_ids = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((n, length), dtype=torch.long)
        for i, (seq, lab) in enumerate(zip(sequences, labels)):
            input_ids[i, : len(seq)] = torch.tensor(seq)
            label_ids[i, : len(lab)] = torch.tensor(lab)
            attention_mask[i, : len(seq)] = 1

        counts = [len(f["response_ids"]) for f in features]
        k_max = max(counts)
        candidate_mask = torch.arange(k_max)[None, :] < torch.tensor(counts)[:, None]
        batch = {
            "input_ids": input_ids,  # (N, T)
            "attention_mask": attention_mask,  # (N, T)
            "labels": label_ids,  # (N, T)
            "candidate_mask": candidate_mask,  # (B, K)
        }
        for key in CANDIDATE_FLOATS:
            if key in features[0] and features[0][key] is not None:
                values = torch.zeros((len(features), k_max), dtype=torch.float32)
                for b, f in enumerate(features):
                    values[b, : counts[b]] = torch.tensor(f[key], dtype=torch.float32)
                batch[key] = values  # (B, K)
        if "row_id" in features[0]:
            batch["row_id"] = torch.tensor([f["row_id"] for f in features])  # (B,)
        return batch
