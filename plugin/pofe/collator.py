"""Batch B prompts x k candidates (k may differ between prompts).

Only real candidates become sequences: N = sum_b k_b rows of `prompt + response`,
right-padded to the longest, with labels on response tokens only. `candidate_mask`
(B, K) with K = max_b k_b says where each flat row goes back: the rows are the True
entries of the mask in row-major order, so `x.new_zeros(B, K).masked_scatter(mask, flat)`
restores the (B, K) layout.

With `prefix_sharing=True` the rows are instead one packed row per prompt,
`prompt, r_1, ..., r_k` (B rows, right-padded to the longest), plus `segment_ids` and
`position_ids`, from which scoring builds the block attention mask (`pofe.prefix`) or
splits the row into prompts and responses for the KV-cache layout (`pofe.prefix_cache`),
whichever `pofe.prefix_layout` picks; `labels`
then mark the scored tokens in place (they are not shifted targets there: the first
token of r_i is predicted at the last prompt position). `candidate_mask` and the
per-candidate columns are the same in both layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pofe.columns import IGNORE_INDEX, candidate_float_columns, pack_prompt


@dataclass
class KResponseCollator:
    """Collator built by axolotl as `cls(tokenizer, padding=..., pad_to_multiple_of=..., **kwargs)`.

    `prefix_sharing` comes from the plugin's collator kwargs
    (`pofe.prefix.prefix_sharing_enabled(cfg)`).
    """

    tokenizer: Any
    padding: bool | str = True
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    prefix_sharing: bool = False

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if self.prefix_sharing:
            batch = self._packed(features)
        else:
            batch = self._unshared(features)
        counts = [len(f["response_ids"]) for f in features]
        k_max = max(counts)
        batch["candidate_mask"] = torch.arange(k_max)[None, :] < torch.tensor(counts)[:, None]  # (B, K)
        for key in candidate_float_columns():
            if key in features[0] and features[0][key] is not None:
                values = torch.zeros((len(features), k_max), dtype=torch.float32)
                for b, f in enumerate(features):
                    values[b, : counts[b]] = torch.tensor(f[key], dtype=torch.float32)
                batch[key] = values  # (B, K)
        if "row_id" in features[0]:
            batch["row_id"] = torch.tensor([f["row_id"] for f in features])  # (B,)
        return batch

    def _pad_id(self) -> int:
        pad_id = self.tokenizer.pad_token_id
        return self.tokenizer.eos_token_id if pad_id is None else pad_id

    def _padded_length(self, length: int) -> int:
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        return length

    def _packed(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """B packed rows `prompt, r_1, ..., r_k`: no candidate is padded, only the rows."""
        rows = [pack_prompt(list(f["prompt_ids"]), [list(r) for r in f["response_ids"]]) for f in features]
        length = self._padded_length(max(len(tokens) for tokens, _, _ in rows))
        b = len(rows)
        input_ids = torch.full((b, length), self._pad_id(), dtype=torch.long)
        label_ids = torch.full((b, length), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((b, length), dtype=torch.long)
        segment_ids = torch.full((b, length), -1, dtype=torch.long)
        position_ids = torch.zeros((b, length), dtype=torch.long)
        for i, (tokens, segments, positions) in enumerate(rows):
            n = len(tokens)
            input_ids[i, :n] = torch.tensor(tokens, dtype=torch.long)
            segment_ids[i, :n] = torch.tensor(segments, dtype=torch.long)
            position_ids[i, :n] = torch.tensor(positions, dtype=torch.long)
            attention_mask[i, :n] = 1
        response = segment_ids >= 1
        label_ids[response] = input_ids[response]
        return {
            "input_ids": input_ids,  # (B, L)
            "attention_mask": attention_mask,  # (B, L) real tokens; attention itself follows segment_ids
            "labels": label_ids,  # (B, L) scored tokens in place (not shifted)
            "segment_ids": segment_ids,  # (B, L) -1 pad, 0 prompt, i response i
            "position_ids": position_ids,  # (B, L) restart at P for every response
        }

    def _unshared(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """N = sum_b k_b rows `prompt + response`, right-padded."""
        sequences, labels = [], []
        for f in features:
            prompt = list(f["prompt_ids"])
            for response in f["response_ids"]:
                sequences.append(prompt + list(response))
                labels.append([IGNORE_INDEX] * len(prompt) + list(response))

        length = max(len(s) for s in sequences)
        length = self._padded_length(length)
        pad_id = self._pad_id()
        n = len(sequences)
        input_ids = torch.full((n, length), pad_id, dtype=torch.long)
        label_ids = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((n, length), dtype=torch.long)
        for i, (seq, lab) in enumerate(zip(sequences, labels)):
            input_ids[i, : len(seq)] = torch.tensor(seq)
            label_ids[i, : len(lab)] = torch.tensor(lab)
            attention_mask[i, : len(seq)] = 1

        return {
            "input_ids": input_ids,  # (N, T)
            "attention_mask": attention_mask,  # (N, T)
            "labels": label_ids,  # (N, T)
        }
