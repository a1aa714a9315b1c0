"""What the trainers log: each prompt's best and worst candidate compared (`pair_metrics`),
and every statistic kept on the device until transformers logs (`MetricWindow`).

TRL's DPOTrainer logs, per chosen/rejected pair, `rewards/chosen` and `rewards/rejected`
(beta * log-ratio to the reference model, its implicit reward), `rewards/margins` (their
difference), `rewards/accuracies` (share of pairs with chosen > rejected) and `logps/chosen`,
`logps/rejected` (summed response log-probs under the policy). A POFE prompt has k candidates,
so its pair is its most and its least preferred candidate: the ends of the order the method
learns. A method logs a quantity under TRL's name only where it is TRL's quantity
(docs/hyperparameters.md has the mapping): SPPO's log-ratio to its anchor is TRL's implicit
reward, RRHF, which has no reference model, logs its length-normalised scores under its own
names (`pofe.trainers.rrhf`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from pofe.distributed import sum_over_ranks

# a statistic as a loss returns it: a 0-dim tensor (on the device, read nowhere) or a number
Stat = Tensor | float


class PairMetrics(NamedTuple):
    """Means over the prompts that have a pair (0-dim tensors, NaN without one), and how many
    prompts that is (a 0-dim tensor)."""

    values: dict[str, Tensor]
    num_pairs: Tensor


class PairNames(NamedTuple):
    """What a method calls the pair's quantities; None: not logged."""

    chosen_reward: str | None
    rejected_reward: str | None
    margin: str | None
    accuracy: str | None
    chosen_logp: str | None = "logps/chosen"
    rejected_logp: str | None = "logps/rejected"


TRL_NAMES = PairNames("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")


def pair_metrics(
    logp_sum: Tensor, reward: Tensor, preference: Tensor, mask: Tensor, names: PairNames = TRL_NAMES
) -> PairMetrics:
    """TRL's pair metrics with chosen = each prompt's most preferred candidate, rejected = its least.

    chosen is the real candidate with the highest `preference` (reward or win rate),
    rejected the one with the lowest; the first index wins a tie. A prompt whose real
    candidates all have the same preference has no pair and is left out (TRL never sees
    such a pair). No host synchronisation: the means stay on the device.

    Args:
        logp_sum: (B, K) summed response log-probs under the policy.
        reward: (B, K) what the pair's rewards are (SPPO: beta * log-ratio to the anchor, as
            TRL; RRHF: the length-normalised score its hinge compares).
        preference: (B, K) what orders the candidates (RRHF's rewards, SPPO's win rates).
        mask: (B, K) bool, True for real candidates; padded slots may hold anything.
        names: what each quantity is logged as (`TRL_NAMES` by default).

    Returns:
        `PairMetrics` under `names`: chosen and rejected reward, their margin, the share of
        pairs with a positive margin, chosen and rejected summed log-prob.
    """
    with torch.no_grad():
        pref = preference.detach().to(torch.float64)
        best = torch.where(mask, pref, float("-inf")).argmax(dim=1, keepdim=True)  # (B, 1)
        worst = torch.where(mask, pref, float("inf")).argmin(dim=1, keepdim=True)  # (B, 1)
        has_pair = (pref.gather(1, best) > pref.gather(1, worst)).to(torch.float64)  # (B, 1)
        logps, rewards = logp_sum.detach().to(torch.float64), reward.detach().to(torch.float64)
        chosen, rejected = rewards.gather(1, best), rewards.gather(1, worst)  # (B, 1)
        per_prompt = {
            names.chosen_reward: chosen,
            names.rejected_reward: rejected,
            names.margin: chosen - rejected,
            names.accuracy: (chosen > rejected).to(torch.float64),
            names.chosen_logp: logps.gather(1, best),
            names.rejected_logp: logps.gather(1, worst),
        }  # each (B, 1)
        n = has_pair.sum()
        # 0 * NaN is NaN: a NaN in a prompt without a pair must not reach the sum
        values = {
            name: torch.where(n > 0, torch.where(has_pair > 0, v, 0.0).sum() / n.clamp(min=1), float("nan"))
            for name, v in per_prompt.items()
            if name is not None
        }
    return PairMetrics(values, n)


class MetricWindow:
    """Each split's statistics since transformers last logged, summed on the device.

    `add` keeps, per name, the sum of value x weight and the sum of weights (a NaN value,
    a statistic with nothing to average, weighs 0) as one (2, N) tensor on the device: no
    host synchronisation. `flush`, when transformers logs, sums them over the ranks in one
    collective and reads them once: each value is then the mean over every prompt of every
    rank since the last log (a step's prompts weigh as much as another's).
    """

    def __init__(self):
        self.names: dict[str, dict[str, int]] = {}  # split -> name -> row of sums
        self.sums: dict[str, Tensor] = {}  # split -> (2, N): weighted sums, weights

    def add(self, split: str, counted: Mapping[str, tuple[Stat, Stat]], device: torch.device | str) -> None:
        """Add `counted` = {name: (value, weight)} to `split`'s window (every rank calls this
        with the same names, as it calls `flush`)."""
        index = self.names.setdefault(split, {})
        for name in counted:
            index.setdefault(name, len(index))
        given = [counted.get(name, (float("nan"), 0.0)) for name in index]  # a name not given: weight 0
        values = torch.stack([_on(value, device) for value, _ in given])  # (N,)
        weights = torch.where(values.isnan(), 0.0, torch.stack([_on(weight, device) for _, weight in given]))
        step = torch.stack([torch.where(values.isnan(), 0.0, values) * weights, weights])  # (2, N)
        old = self.sums.get(split)
        if old is not None:  # a name new in this step: its earlier sums are 0
            step = step + torch.nn.functional.pad(old, (0, len(index) - old.shape[1]))
        self.sums[split] = step

    def flush(self, split: str, device: torch.device | str) -> dict[str, float]:
        """`split`'s means since the last flush (names with no weight left out), read once;
        evaluation's named `eval_<name>`, as TRL's DPO names them beside `eval_loss`."""
        if split not in self.sums:
            return {}
        names, sums = self.names.pop(split), self.sums.pop(split)
        totals, weights = sum_over_ranks(sums, device).tolist()  # the one host synchronisation
        # + 0.0: a mean of -0.0 (SPPO's mean target is 0 by construction when every candidate is
        # kept) would be logged as '-0'
        key = "{}" if split == "train" else "eval_{}"
        return {key.format(name): totals[i] / weights[i] + 0.0 for name, i in names.items() if weights[i] > 0}


def _on(x: Stat, device: torch.device | str) -> Tensor:
    """A statistic as a 0-dim float64 tensor on `device`; a number is written there by a kernel,
    not copied from the host (a copy could wait for the device)."""
    if isinstance(x, Tensor):
        return x.detach().to(device=device, dtype=torch.float64).reshape(())
    return torch.full((), float(x), dtype=torch.float64, device=device)
