"""RRHF trainer: length-normalised ranking hinge plus SFT on the best of k.

Besides `rrhf/*` it logs TRL's `rewards/*` and `logps/*` for the best- and worst-reward
candidate of each prompt (`best_worst_metrics`). RRHF has no reference model, so its
`rewards/*` are the length-normalised log-likelihoods its hinge compares,
logp_sum / length ** length_penalty, not a beta-scaled log-ratio.
"""

from __future__ import annotations

from pofe.losses import rrhf_loss
from pofe.trainers.base import LOGP_HINT, LOSS_HINT, KResponseTrainer
from pofe.trainers.metrics import best_worst_metrics


class RRHFTrainer(KResponseTrainer):
    required_keys = ("rewards",)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logp, lengths = self.score_candidates(model, inputs)  # (B, K)
        loss, stats = rrhf_loss(
            logp,
            lengths,
            inputs["rewards"],
            mask=inputs["candidate_mask"],
            rank_weight=self.args.pofe_rank_weight,
            margin=self.args.pofe_margin,
            length_penalty=self.args.pofe_length_penalty,
        )
        self.check_finite(inputs, loss, {"logp": LOGP_HINT, "loss": LOSS_HINT}, logp=logp)
        scores = logp / lengths**self.args.pofe_length_penalty  # (B, K), the scores the hinge compares
        pairs = best_worst_metrics(logp, scores, inputs["rewards"], inputs["candidate_mask"])
        self.log_stats(model, "rrhf", stats, num_prompts=len(logp), pairs=pairs)
        return (loss, {"scores": logp}) if return_outputs else loss
