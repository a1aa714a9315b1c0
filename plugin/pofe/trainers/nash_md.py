"""Nash-MD trainer: Nash-MD-PG's policy gradient on each sample's preference over the mixture's.

Each row is a prompt with the policy's own samples y_i, each labelled with P(y_i beats y'_i)
against an opponent y'_i sampled from the geometric mixture of the policy and pi_0, and
carrying log pi_0(y_i) (`pi_0_logps`), all from the online refresh (`pofe.online.opponents`).
The loss is `nash_md_loss` over the batch's real samples (`candidate_mask`), with `pofe.online.kl_coef` as tau.
"""

from __future__ import annotations

from pofe.columns import PI_0_LOGPS
from pofe.losses import nash_md_loss
from pofe.trainers.k_response import LOGP_HINT, LOSS_HINT, KResponseTrainer

BASE_HINT = "pi_0's log-probs of those samples were written non-finite by their refresh: delete it and resume"


class NashMDTrainer(KResponseTrainer):
    required_keys = ("preferences", PI_0_LOGPS)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logp, _ = self.score_candidates(model, inputs)  # (B, K)
        mask = inputs["candidate_mask"]  # (B, K)
        pi_0 = inputs[PI_0_LOGPS]  # (B, K)
        loss, stats = nash_md_loss(logp, pi_0, inputs["preferences"], self.args.pofe_kl_coef, mask=mask)
        hints = {"logp": LOGP_HINT, "pi_0": BASE_HINT, "loss": LOSS_HINT}
        self.check_finite(inputs, loss, hints, logp=logp, pi_0=pi_0)
        self.log_stats(model, "nash_md", stats, num_prompts=len(mask))
        return (loss, {"logratio": logp - pi_0}) if return_outputs else loss
