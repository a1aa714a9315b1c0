"""RRHF trainer: length-normalised ranking hinge plus SFT on the best of k."""

from __future__ import annotations

from ..losses import rrhf_loss
from .base import KResponseTrainer


class RRHFTrainer(KResponseTrainer):
    required_keys = ("rewards",)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logp, lengths = self.score_candidates(model, inputs)  # (B, K)
        loss, stats = rrhf_loss(
            logp,
            lengths,
            inputs["rewards"],
            mask=inputs["candidate_mask"],
            rank_weight=self.pofe.rank_weight,
            margin=self.pofe.margin,
            length_penalty=self.pofe.length_penalty,
        )
        self.log_stats(model, "rrhf", stats, num_prompts=len(logp))
        return (loss, {"scores": logp}) if return_outputs else loss
