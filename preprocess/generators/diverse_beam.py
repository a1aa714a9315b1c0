"""Diverse beam search (Vijayakumar et al. 2016, arXiv 1610.02424) for transformers >= 5.

Transformers 5 moved group beam search out of core (`generate(num_beam_groups=...)` now asks
for `custom_generate='transformers-community/group-beam-search'`, which downloads code from
the hub: not possible offline, and remote code is not something a preprocessing step should
run). POFE therefore runs the groups itself.

Deviation from the paper, stated: the paper advances all G groups in lock-step and, at step
t, penalises group g for tokens that groups 0..g-1 chose at step t *in their current beams*.
Here the groups run one after another: group g is an ordinary beam search whose log-probs
at generated position t are lowered by `diversity_penalty * c_v`, where c_v counts the
FINISHED sequences of groups 0..g-1 that have token v at position t (Hamming diversity
against the earlier groups' final outputs). Group 0 is plain beam search in both versions;
the penalty has the same form; the beams it is measured against are the earlier groups'
final beams rather than their in-flight ones.
"""

from __future__ import annotations

import torch


class HammingDiversityProcessor:
    """Logits processor: penalise tokens that earlier groups emitted at the same position.

    Args:
        previous: (B, M, T_prev) int64 token ids of the earlier groups' outputs for each of the
            B prompts (M sequences each), padded with -1 (never matches a token id).
        prompt_len: length of the (left-padded) prompt block; generated position t is
            `input_ids.shape[1] - prompt_len`.
        num_beams: beams per prompt in the current group; rows of `input_ids` are ordered
            prompt-major, (B * num_beams, cur_len).
        penalty: subtracted from the log-prob once per earlier sequence that used the token.
    """

    def __init__(self, previous: torch.Tensor, prompt_len: int, num_beams: int, penalty: float):
        self.previous = previous
        self.prompt_len = prompt_len
        self.num_beams = num_beams
        self.penalty = penalty

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # scores: (B * num_beams, V) log-probs
        t = input_ids.shape[1] - self.prompt_len
        if self.previous.numel() == 0 or t >= self.previous.shape[2] or self.penalty == 0:
            return scores
        tokens = self.previous[:, :, t]  # (B, M)
        valid = tokens >= 0
        counts = torch.zeros(tokens.shape[0], scores.shape[1], dtype=scores.dtype, device=scores.device)  # (B, V)
        counts.scatter_add_(1, tokens.clamp(min=0).to(scores.device), valid.to(scores.dtype).to(scores.device))
        counts = counts.repeat_interleave(self.num_beams, dim=0)  # (B * num_beams, V)
        return scores - self.penalty * counts
