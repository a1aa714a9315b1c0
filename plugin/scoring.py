"""Summed response log-probs per candidate: the score both methods are built on."""

from __future__ import annotations

import torch
from trl.trainer.utils import selective_log_softmax

from .collator import IGNORE_INDEX


def response_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return each row's summed log-prob over its labelled tokens, and their count.

    Args:
        input_ids, attention_mask, labels: (N, T); labels are IGNORE_INDEX outside
            the response.

    Returns:
        logp_sum (N,) float32 and lengths (N,) int. TRL's `selective_log_softmax`
        gathers the chosen tokens row by row, so no full-vocabulary float32
        log-softmax of all N sequences exists at once.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    targets = labels[:, 1:]  # (N, T-1): token t+1 is predicted at position t
    mask = targets != IGNORE_INDEX
    token_logps = selective_log_softmax(logits[:, :-1], targets.clamp(min=0))  # (N, T-1)
    token_logps = torch.where(mask, token_logps.float(), 0.0)
    return token_logps.sum(-1), mask.sum(-1)
