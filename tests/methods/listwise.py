"""A third POFE method defined outside the package: ListNet's listwise loss over rewards.

Everything a new method needs, in one module that touches nothing under `plugin/` or
`preprocess/` beyond the one `register_method` call: its target (a label column of its
own, `scores`, filled with the judge's rewards), its loss, its trainer and its spec. A
recipe selects it with `rl: listwise` and lists `ListwisePlugin` under `plugins:`, so that
every axolotl process (`preprocess`, `train`) imports this module, and so registers the
method, before POFE reads the config.
"""

from __future__ import annotations

import torch
from axolotl.integrations.base import BasePlugin
from torch import Tensor

from pofe.methods import MethodSpec, Target, register_method
from pofe.trainers.k_response import KResponseTrainer


def listnet_loss(logp: Tensor, lengths: Tensor, rewards: Tensor, mask: Tensor) -> Tensor:
    """ListNet (Cao et al. 2007, "Learning to Rank: From Pairwise Approach to Listwise
    Approach", eq. 6 with the top-one probability): per prompt, the cross-entropy between
    the rewards' and the policy scores' softmax over the k candidates,

        L = - sum_j softmax(r)_j * log softmax(s)_j,   s_j = log pi(y_j | x) / |y_j|,

    averaged over prompts. All inputs (B, K); `mask` (B, K) bool marks real candidates.
    """
    scores = logp / lengths.clamp(min=1)  # (B, K) length-normalised, as RRHF's
    low = torch.finfo(scores.dtype).min
    target = torch.softmax(rewards.masked_fill(~mask, low), dim=-1)  # (B, K)
    log_p = torch.log_softmax(scores.masked_fill(~mask, low), dim=-1)  # (B, K)
    return -(target * log_p.masked_fill(~mask, 0.0)).sum(dim=-1).mean()


class ListwiseTrainer(KResponseTrainer):
    required_keys = ("scores",)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logp, lengths = self.score_candidates(model, inputs)  # (B, K)
        loss = listnet_loss(logp, lengths, inputs["scores"], inputs["candidate_mask"])
        self.log_stats(model, "listwise", {"loss": loss.detach()}, num_prompts=len(logp))  # read once per log
        return (loss, {"scores": logp}) if return_outputs else loss


LISTWISE = register_method(
    MethodSpec(
        name="listwise",
        target=Target(column="scores", noun="scores", from_win_rates=False, distinct_in_float32=True),
        trainer="tests.methods.listwise.ListwiseTrainer",
        dataset_types=("pofe.prompts", "pofe.rrhf"),
        needs_anchor=False,
        default_round_prompts="all",
        diagnostic_metric="listwise/loss",
        diagnostic_label="listwise loss",
        candidate_keeps=("all",),
        dedupe_candidates=True,
    )
)


class ListwisePlugin(BasePlugin):
    """Listed under `plugins:` so that axolotl imports this module, registering the method."""
