"""What RRHF and SPPO trainers share: batch checks, scoring, (B, K) layout, metrics."""

from __future__ import annotations

import torch
from axolotl.core.trainers.base import AxolotlTrainer
from transformers import Trainer

from pofe.anchor import AnchorLogps
from pofe.columns import tokenized_columns
from pofe.compat.trainer import TrainerHooks, without_token_perplexity
from pofe.distributed import deepspeed_on_cpu_ranks
from pofe.methods import method_spec
from pofe.quantization import keep_4bit_trainable
from pofe.scoring import score_candidates as score_batch
from pofe.trainers.metrics import MetricWindow, PairMetrics, Stat

BATCH_KEYS = ("input_ids", "attention_mask", "labels", "candidate_mask")
# what to do when the policy's own log-probs (or a loss from finite inputs) are not finite
LOGP_HINT = (
    "the policy's log-probs overflowed or its weights hold NaN: train in bf16 or fp32 rather than fp16, "
    "lower learning_rate, or check the checkpoint"
)
LOSS_HINT = "check those rows' labels and the method's settings (e.g. eta, margin, length_penalty)"


class KResponseTrainer(TrainerHooks, AxolotlTrainer, without_token_perplexity(Trainer)):
    """Scores every candidate of a (B prompts x k candidates) batch from `KResponseCollator`.

    The `pofe:` keys it reads are `self.args.pofe_<key>` (`pofe.training_args`), filled once
    by `PofePlugin.get_training_args`. The Trainer's internals it overrides, and axolotl 0.19's
    token perplexity it drops from the logs, are `pofe.compat`'s.
    """

    # keys besides BATCH_KEYS that compute_loss reads from the batch
    required_keys: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # SPPO's anchor pass and evaluation run without gradients; on some CPUs that would
        # move 4-bit layers to a kernel that trains wrong (pofe.quantization)
        keep_4bit_trainable(self.model)
        # an anchored method's log pi_t table (`pofe.anchor`), computed lazily in the first
        # step, once accelerate/DeepSpeed/FSDP have wrapped the model, so the pass works under
        # every backend axolotl supports
        self.anchor = AnchorLogps(self) if method_spec(self.args.pofe_method).needs_anchor else None
        # the loss's statistics, on the device until transformers logs (`log_stats`, `log`)
        self.metric_window = MetricWindow()

    def keeps_configured_state(self) -> bool:
        # the DeepSpeed state `place_ranks_on_cpu` made: accelerate, making it again without a
        # backend, would count one process and give each rank the whole data set
        return deepspeed_on_cpu_ranks(self.args.deepspeed)

    def batch_columns(self) -> list[str]:
        # the prepared columns are not forward() arguments but must reach the collator
        return list(tokenized_columns())

    def score_candidates(self, model, inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the model on all candidates; return logp_sum and lengths as (B, K).

        The batch is in either layout of `KResponseCollator` (prefix-shared packed rows
        carry `segment_ids`); `pofe.scoring.score_candidates` gives the same result.
        """
        missing = [k for k in BATCH_KEYS + self.required_keys if k not in inputs]
        if missing:
            raise KeyError(
                f"{type(self).__name__} batch is missing {missing}; POFE needs its own "
                "collator (is another plugin replacing it?)"
            )
        args = self.args
        return score_batch(model, inputs, chunk_size=args.pofe_logit_chunk_size, prefix_layout=args.pofe_prefix_layout)

    def check_finite(self, inputs, loss: torch.Tensor, hints: dict[str, str], **per_candidate: torch.Tensor) -> None:
        """Stop on a non-finite loss or per-candidate value (`per_candidate`: name -> (B, K),
        e.g. logp, anchor); padded slots (`candidate_mask` False) are not read. A NaN would
        otherwise train a NaN model to the end: `log_stats` weighs NaN stats 0, so they just
        vanish from the log. One device sync per step; the error names the batch's rows
        (`row_id`, else positions in the batch) and, per value, `hints[name]`: what to do."""
        mask = inputs["candidate_mask"]  # (B, K)
        total = sum(torch.where(mask, v.float(), 0.0) for v in per_candidate.values())  # (B, K)
        if bool(torch.isfinite(total).all() & torch.isfinite(loss.detach()).all()):
            return
        rows = inputs["row_id"].tolist() if "row_id" in inputs else None
        label = "rows (row_id)" if rows is not None else "prompts at batch positions"
        found = []
        for name, value in per_candidate.items():
            bad = (~torch.isfinite(value) & mask).any(dim=1).nonzero().flatten().tolist()  # (B,) -> positions
            if bad:
                found.append(
                    f"{name} is not finite for {label} {[rows[b] if rows else b for b in bad]}: {hints[name]}"
                )
        if not found:
            found.append(f"the loss is {loss.item()} with finite inputs: {hints['loss']}")
        raise FloatingPointError(
            f"{type(self).__name__} at step {self.state.global_step}: "
            + "; ".join(found)
            + " Training stopped: a NaN or inf here would make every weight NaN."
        )

    def log_stats(
        self, model, prefix: str, stats: dict[str, Stat], num_prompts: int, pairs: PairMetrics | None = None
    ) -> None:
        """Keep the batch's stats (a loss's 0-dim tensors, or numbers) for the next log.

        `stats` are kept as `<prefix>/<name>`, weighted by `num_prompts`; `pairs` under their
        own names, weighted by the prompts that have a pair. Nothing is read on the host here:
        `log` reads every kept statistic once per logging step, summed over the steps since the
        last log and over the ranks in one collective (`MetricWindow`), so a statistic is the
        mean over every prompt of every rank in the window (a NaN, a stat with nothing to
        average, weighs 0). Every rank calls this once per loss. Evaluation stats are logged
        as `eval_<name>`, as TRL's DPO names them, beside `eval_loss`.
        """
        counted = {f"{prefix}/{k}": (v, num_prompts) for k, v in stats.items()}
        if pairs is not None:
            counted.update({k: (v, pairs.num_pairs) for k, v in pairs.values.items()})
        self.metric_window.add("train" if model.training else "eval", counted, self.args.device)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The kept statistics of the split being logged (`loss`: training's, `eval_loss`:
        evaluation's) read, once, into axolotl's stored metrics, which its `log` adds."""
        split = "train" if "loss" in logs else "eval" if "eval_loss" in logs else None
        if split is not None:
            self.store_metrics(self.metric_window.flush(split, self.args.device), split)
        super().log(logs, start_time)
