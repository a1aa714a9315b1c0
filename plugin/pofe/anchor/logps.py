"""The trainer's tables: SPPO's anchor log pi_t(y | x) and, with `pofe.anchor_mix`, pi_0's.

pi_t is the policy as it stands before training, so one no-grad pass of the policy itself,
before its first update, gives every anchor log-prob; no second model sits in memory. With a
fresh LoRA/QLoRA adapter (B = 0) the adapted policy equals its base; with a loaded adapter
(`lora_model_dir`, the previous SPPO iterate) it is that iterate, which is the anchor SPPO
asks for. pi_0's table comes from the pass `pofe.anchor.pi_0.pi_0_route` names. Both are
cached beside the prepared data (`pofe.anchor.table`).

Under several processes each scores its share of the batches and the table is merged,
so every rank holds the same table as a one-process run (`pofe.distributed`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from pofe.anchor.pi_0 import REDO as PI_0_REDO
from pofe.anchor.pi_0 import WHAT as PI_0
from pofe.anchor.pi_0 import adapter_disabled, pi_0_route, pi_0_table_path
from pofe.anchor.table import ANCHOR_REDO, RowScorer, cached_table, checked_table, save_table, score_rows, table_path
from pofe.columns import PI_0_LOGPS
from pofe.distributed import all_ranks
from pofe.files import weights_fingerprint
from pofe.logs import get_logger

LOG = get_logger(__name__)

ANCHOR = "SPPO anchor"


class AnchorLogps:
    """Anchor (and pi_0) log-probs per (row, candidate), looked up by the batch's `row_id`."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.table: torch.Tensor | None = None  # (num_rows, K_max), float32, CPU: the policy before training
        self.path: Path | None = None  # the table's cache file, once looked up
        self.pi_0: torch.Tensor | None = None  # (num_rows, K_max): pi_0's, with pofe.anchor_mix
        self.pi_0_path: Path | None = None

    def lookup(self, model, inputs) -> torch.Tensor:
        """(B, K) anchor log-probs for the batch: given in the data, else the table."""
        if "anchor_logps" in inputs:
            return inputs["anchor_logps"]
        return self._rows(self._own(model), inputs)

    def lookup_pi_0(self, model, inputs) -> torch.Tensor:
        """(B, K) pi_0 log-probs for the batch: given in the rows (an online refresh's), else
        pi_0's table (`pofe.anchor.pi_0`)."""
        if PI_0_LOGPS in inputs:
            return inputs[PI_0_LOGPS]
        if self.pi_0 is None:
            self.pi_0 = self._load_pi_0(model)
        return self._rows(self.pi_0, inputs)

    def fix_hint(self, pi_0: bool = False) -> str:
        """What to do about a non-finite entry of the anchor table (`pi_0`: of pi_0's)."""
        path = self.pi_0_path if pi_0 else self.path
        return (
            f"the table {path} holds them: delete it so the next run computes it again, and "
            "check the model's dtype (fp16 overflows where bf16 or fp32 does not)"
        )

    def _rows(self, table: torch.Tensor, inputs) -> torch.Tensor:
        if "row_id" not in inputs:
            raise KeyError("SPPO batch has no row_id to look its anchor log-probs up by")
        k = inputs["candidate_mask"].shape[1]
        return table[inputs["row_id"].cpu(), :k].to(inputs["input_ids"].device)

    def _own(self, model) -> torch.Tensor:
        if self.table is None:
            self.table = self._load_or_compute(model)
        return self.table

    def _datasets(self):
        return [d for d in (self.trainer.train_dataset, self.trainer.eval_dataset) if d is not None]

    def _scorer(self) -> RowScorer:
        trainer, args = self.trainer, self.trainer.args
        return RowScorer(
            collate=trainer.data_collator,
            score=trainer.score_candidates,
            batch_size=args.per_device_eval_batch_size,
            device=args.device,
            progress=not args.disable_tqdm,
        )

    def _cache_path(self) -> Path:
        cfg = self.trainer.axolotl_cfg
        weights = [
            weights_fingerprint(cfg.base_model, cfg.revision_of_model),
            weights_fingerprint(cfg.lora_model_dir) if cfg.lora_model_dir else None,
        ]
        return table_path(cfg, self._datasets(), "anchor", weights)

    def _load_or_compute(self, model) -> torch.Tensor:
        path = self.path = self._cache_path()
        # one decision for all ranks: a rank that computes waits for the others' rows
        if all_ranks(path.exists(), self.trainer.args.device):
            LOG.info(f"POFE: loading SPPO anchor log-probs from {path}")
            return cached_table(path, self._datasets(), ANCHOR, ANCHOR_REDO)
        step = self.trainer.state.global_step
        if step > 0:
            # the policy has trained: its log-probs are no longer pi_t's
            raise RuntimeError(
                f"SPPO's anchor is the policy before training, but this run resumes at step "
                f"{step} and no anchor table for its rows and model is cached at {path}. "
                "Restore the table computed at step 0 (same model, same prepared data), or "
                "start the training over without resume_from_checkpoint."
            )
        table = checked_table(self.compute(model), self._datasets(), "the policy", ANCHOR)
        self._save(path, table, ANCHOR)
        return table

    def _load_pi_0(self, model) -> torch.Tensor:
        cfg, args = self.trainer.axolotl_cfg, self.trainer.args
        route = pi_0_route(cfg, args.pofe_pi_0)
        if route == "policy":
            LOG.info(
                "POFE: pofe.anchor_mix: pi_0 is the policy this training starts from, whose log-probs are "
                "the anchor's (round 1 of an iterated run); offline, set pofe.pi_0 to the run's first model"
            )
            return self._own(model)
        datasets = self._datasets()
        path = self.pi_0_path = pi_0_table_path(cfg, args.pofe_pi_0, route, datasets)
        if all_ranks(path.exists(), args.device):
            LOG.info(f"POFE: loading pi_0's log-probs from {path}")
            return cached_table(path, datasets, PI_0, PI_0_REDO)
        if route == "apart":
            raise FileNotFoundError(
                f"pofe.anchor_mix: no table of pi_0's ({args.pofe_pi_0}) log-probs at {path}. It is "
                "computed as the rows load (axolotl preprocess or axolotl train, through PofePlugin's "
                "load_datasets hook), which has not run for these rows: run `axolotl preprocess` on the recipe"
            )
        with adapter_disabled(self.trainer.accelerator.unwrap_model(model)):
            table = score_rows(model, datasets, self._scorer(), "pi_0 (the policy without its adapter)")
        table = checked_table(table, datasets, "the policy without its adapter (pi_0)", PI_0)
        self._save(path, table, PI_0)
        return table

    def _save(self, path: Path, table: torch.Tensor, what: str) -> None:
        if self.trainer.accelerator.is_main_process:
            save_table(path, table)
            LOG.info(f"POFE: cached {what} log-probs at {path}")

    def compute(self, model, sort_by_length: bool = True) -> torch.Tensor:
        """The policy's own pass over every row of the train and eval sets (`score_rows`)."""
        return score_rows(model, self._datasets(), self._scorer(), ANCHOR, sort_by_length=sort_by_length)
