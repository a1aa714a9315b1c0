"""TRL's preference metrics (`rewards/*`, `logps/*`) for batches of k candidates per prompt.

TRL's DPOTrainer (and the SPPO authors' trainer, a copy of it) logs, per chosen/rejected
pair, `rewards/chosen` and `rewards/rejected` (each response's implicit reward),
`rewards/margins` (their difference), `rewards/accuracies` (share of pairs with
chosen > rejected) and `logps/chosen`, `logps/rejected` (summed response log-probs),
each a mean over the pairs of all ranks. A POFE prompt has k candidates, so its pair is
its most and its least preferred candidate: the ends of the order the method learns.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class PairMetrics(NamedTuple):
    """TRL-named means over the prompts that have a pair, and how many prompts that is."""

    values: dict[str, float]
    num_pairs: int


def best_worst_metrics(logp_sum: Tensor, implicit_reward: Tensor, preference: Tensor, mask: Tensor) -> PairMetrics:
    """TRL's DPO metrics with chosen = each prompt's most preferred candidate, rejected = its least.

    chosen is the real candidate with the highest `preference` (reward or win rate),
    rejected the one with the lowest; the first index wins a tie. A prompt whose real
    candidates all have the same preference has no pair and is left out (TRL never sees
    such a pair).

    Args:
        logp_sum: (B, K) summed response log-probs under the policy.
        implicit_reward: (B, K) what `rewards/*` reports (SPPO: beta * log-ratio to the
            anchor, as TRL; RRHF: the length-normalised score its hinge compares).
        preference: (B, K) what orders the candidates (RRHF's rewards, SPPO's win rates).
        mask: (B, K) bool, True for real candidates; padded slots may hold anything.

    Returns:
        `PairMetrics`: "rewards/chosen", "rewards/rejected", "rewards/margins",
        "rewards/accuracies", "logps/chosen", "logps/rejected" as means over the prompts
        with a pair (NaN when there is none), and their number.
    """
    with torch.no_grad():
        pref = preference.detach().to(torch.float64)
        best = torch.where(mask, pref, float("-inf")).argmax(dim=1, keepdim=True)  # (B, 1)
        worst = torch.where(mask, pref, float("inf")).argmin(dim=1, keepdim=True)  # (B, 1)
        has_pair = pref.gather(1, best) > pref.gather(1, worst)  # (B, 1)
        logps = logp_sum.detach().to(torch.float64)
        rewards = implicit_reward.detach().to(torch.float64)
        pairs = {
            "rewards/chosen": rewards.gather(1, best),
            "rewards/rejected": rewards.gather(1, worst),
            "logps/chosen": logps.gather(1, best),
            "logps/rejected": logps.gather(1, worst),
        }  # each (B, 1)
        pairs["rewards/margins"] = pairs["rewards/chosen"] - pairs["rewards/rejected"]
        pairs["rewards/accuracies"] = (pairs["rewards/margins"] > 0).to(torch.float64)
        n = int(has_pair.sum())
        values = {name: (v[has_pair].sum() / n).item() if n else float("nan") for name, v in pairs.items()}
    return PairMetrics(values, n)
