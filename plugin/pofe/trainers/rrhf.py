"""RRHF trainer: length-normalised ranking hinge plus SFT on the best of k.

It logs `rrhf/*` and, for the best- and worst-reward candidate of each prompt (`pair_metrics`),
TRL's `logps/chosen` and `logps/rejected` (their summed log-probs, TRL's quantity). RRHF has no
reference model, so it has no implicit reward to log as TRL's `rewards/*`: what it compares
are length-normalised scores, logp_sum / length ** length_penalty, logged under its own names
(`RRHF_PAIR_NAMES`; docs/hyperparameters.md maps them to TRL's).
"""

from __future__ import annotations

from pofe.losses import rrhf_loss
from pofe.trainers.k_response import LOGP_HINT, LOSS_HINT, KResponseTrainer
from pofe.trainers.metrics import PairNames, pair_metrics

# the pair's scores: the best candidate's is the loss's own rrhf/best_score (over every prompt)
RRHF_PAIR_NAMES = PairNames(None, "rrhf/worst_score", "rrhf/score_margin", "rrhf/best_above_worst")


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
        pairs = pair_metrics(logp, scores, inputs["rewards"], inputs["candidate_mask"], RRHF_PAIR_NAMES)
        self.log_stats(model, "rrhf", stats, num_prompts=len(logp), pairs=pairs)
        return (loss, {"scores": logp}) if return_outputs else loss
