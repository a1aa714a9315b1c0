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


def diverse_beam_search(
    model, enc, n: int, num_groups: int, penalty: float, *, pad_token_id: int, **generate_kwargs
) -> torch.Tensor:
    """G groups of n / G beams each, run one after another (see the module docstring).

    Args:
        enc: the tokenised, left-padded prompt batch (input_ids (P, L), attention_mask).
        generate_kwargs: passed to every `model.generate` call (max_new_tokens, eos_token_id).
    Returns:
        (P * n, T) new token ids, prompt-major and group-major within each prompt; rows that
        stopped early end in `pad_token_id`.
    """
    per_group = n // num_groups
    num_prompts, prompt_len = enc["input_ids"].shape
    previous = torch.full((num_prompts, 0, 0), -1, dtype=torch.long)  # (P, M, T)
    groups = []
    for _ in range(num_groups):
        proc = HammingDiversityProcessor(previous, prompt_len, per_group, penalty)
        seqs = model.generate(
            **enc,
            do_sample=False,
            num_beams=per_group,
            num_return_sequences=per_group,
            top_k=None,
            logits_processor=[proc],
            pad_token_id=pad_token_id,
            **generate_kwargs,
        )  # (P * per_group, prompt_len + T)
        new = seqs[:, prompt_len:].reshape(num_prompts, per_group, -1)  # (P, per_group, T)
        groups.append(new)
        seen = new.clone().cpu()
        seen[seen == pad_token_id] = -1  # padding after EOS never counts
        previous = _cat_padded([previous, seen], -1)
    return _cat_padded(groups, pad_token_id).reshape(num_prompts * n, -1)  # (P, G * per_group, T) flattened


def _cat_padded(parts: list[torch.Tensor], value: int) -> torch.Tensor:
    """Concatenate (P, M_i, T_i) tensors along M, right-padding time with `value`."""
    t = max(x.shape[2] for x in parts)
    return torch.cat([torch.nn.functional.pad(x, (0, t - x.shape[2]), value=value) for x in parts], dim=1)


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
