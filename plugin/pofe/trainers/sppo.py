"""SPPO trainer: regress the log-ratio to the anchor policy onto eta * (win rate - 1/2).

Besides `sppo/*` it logs TRL's `rewards/*` and `logps/*` for the highest- and lowest-
win-rate candidate of each prompt (`pair_metrics`; with `sppo_loss: hard`, columns
0 and 1, the chosen and rejected response the loss reads): rewards are
beta * (log pi - log pi_t) with beta = 1/eta, as TRL's DPOTrainer computes them for
`loss_type="sppo_hard"`.

With `pofe.anchor_mix` = beta > 0 the anchor is `mixed_anchor`: (1 - beta) log pi_t + beta
log pi_0 (pi_0's log-probs given in the rows, as an online refresh gives them, else pi_0's table:
`pofe.anchor.pi_0`), for both losses and the implicit rewards.
"""

from __future__ import annotations

import torch

from pofe.columns import PI_0_LOGPS
from pofe.losses import mixed_anchor, sppo_hard_loss, sppo_loss
from pofe.trainers.k_response import LOGP_HINT, LOSS_HINT, KResponseTrainer
from pofe.trainers.metrics import pair_metrics


class SPPOTrainer(KResponseTrainer):
    required_keys = ("win_rates",)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logp, _ = self.score_candidates(model, inputs)  # (B, K)
        anchor = self.anchor.lookup(model, inputs)  # (B, K): log pi_t
        finite = {"logp": logp, "anchor": anchor}
        if self.args.pofe_anchor_mix:
            finite["pi_0"] = self.anchor.lookup_pi_0(model, inputs)  # (B, K)
            anchor = mixed_anchor(anchor, finite["pi_0"], self.args.pofe_anchor_mix)  # (B, K)
        mask = inputs["candidate_mask"]
        if self.args.pofe_sppo_loss == "hard":
            # K = 2 holds two real responses: every row has k >= 2 (`pofe.data.formats`)
            if mask.shape[1] != 2:
                raise ValueError(
                    "pofe.sppo_loss: hard needs exactly two responses (chosen, rejected) "
                    "per row; use a pofe.pairs dataset or sppo_loss: soft"
                )
            loss, stats = sppo_hard_loss(
                logp[:, 0], anchor[:, 0], logp[:, 1], anchor[:, 1], beta=1.0 / self.args.pofe_eta
            )
            # the loss takes column 0 as chosen, whatever the win rates say
            preference = torch.tensor([[1.0, 0.0]], device=logp.device).expand_as(logp)
        else:
            loss, stats = sppo_loss(logp, anchor, inputs["win_rates"], eta=self.args.pofe_eta, mask=mask)
            preference = inputs["win_rates"]
        anchor_hint = (
            "fix field anchor_logps of those dataset rows (or remove it: POFE then computes the anchors)"
            if "anchor_logps" in inputs
            else self.anchor.fix_hint()
        )
        base_hint = (
            f"they came with the rows ({PI_0_LOGPS}): check the dtype of the model that scored them"
            if PI_0_LOGPS in inputs
            else self.anchor.fix_hint(pi_0=True)
        )
        hints = {"logp": LOGP_HINT, "anchor": anchor_hint, "pi_0": base_hint, "loss": LOSS_HINT}
        self.check_finite(inputs, loss, hints, **finite)
        implicit_rewards = (logp - anchor) / self.args.pofe_eta  # (B, K), beta * log-ratio
        pairs = pair_metrics(logp, implicit_rewards, preference, mask)
        self.log_stats(model, "sppo", stats, num_prompts=len(mask), pairs=pairs)
        return (loss, {"logratio": logp - anchor}) if return_outputs else loss
