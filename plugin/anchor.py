"""SPPO's anchor: log pi_t(y | x) for every candidate, computed once, not held as a model.

pi_t is the policy as it stands before training, so one no-grad pass of the policy
itself, before its first update, gives every anchor log-prob; no second model sits in
memory. With a fresh LoRA/QLoRA adapter (B = 0) the adapted policy equals its base;
with a loaded adapter (`lora_model_dir`, the previous SPPO iterate) it is that iterate,
which is the anchor SPPO asks for. The table is cached beside the prepared data, keyed
on the model's weights as well as the config (`pofe.files.weights_fingerprint`), and on the
tokenised rows' content (`rows_digest`).

Under several processes each scores its share of the batches and the table is merged,
so every rank holds the same table as a one-process run (`pofe.distributed`).
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import torch
from tqdm.auto import tqdm

from pofe.batching import length_sorted_batches
from pofe.distributed import all_ranks, merge_rows, rank_and_world
from pofe.files import stable_hash, weights_fingerprint
from pofe.logs import get_logger

LOG = get_logger(__name__)

# Config keys that change the policy's log-probs, and so the cached anchor.
MODEL_IDENTITY_KEYS = (
    "base_model",
    "base_model_config",
    "lora_model_dir",
    "adapter",
    "load_in_4bit",
    "load_in_8bit",
    "bf16",
    "fp16",
    "torch_dtype",
    "chat_template",
    "sequence_len",
)


class AnchorLogps:
    """Anchor log-probs per (row, candidate), looked up by the batch's `row_id`."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.table: torch.Tensor | None = None  # (num_rows, K_max), float32, CPU
        self.path: Path | None = None  # the table's cache file, once looked up

    def lookup(self, model, inputs) -> torch.Tensor:
        """(B, K) anchor log-probs for the batch: given in the data, else the table."""
        if "anchor_logps" in inputs:
            return inputs["anchor_logps"]
        if "row_id" not in inputs:
            raise KeyError("SPPO batch has neither anchor_logps nor row_id")
        if self.table is None:
            self.table = self._load_or_compute(model)
        k = inputs["candidate_mask"].shape[1]
        return self.table[inputs["row_id"].cpu(), :k].to(inputs["input_ids"].device)

    def fix_hint(self) -> str:
        """What to do about a non-finite entry of the table."""
        return (
            f"the anchor table {self.path} holds them: delete it so the next run computes it again, and "
            "check the model's dtype (fp16 overflows where bf16 or fp32 does not)"
        )

    def _datasets(self):
        return [d for d in (self.trainer.train_dataset, self.trainer.eval_dataset) if d is not None]

    def _cache_path(self) -> Path:
        cfg = self.trainer.axolotl_cfg
        identity = {key: str(cfg.get(key)) for key in MODEL_IDENTITY_KEYS}
        identity["data"] = [rows_digest(d) for d in self._datasets()]
        identity["weights"] = [
            weights_fingerprint(cfg.base_model, cfg.revision_of_model),
            weights_fingerprint(cfg.lora_model_dir) if cfg.lora_model_dir else None,
        ]
        return Path(cfg.dataset_prepared_path or "last_run_prepared") / f"pofe-anchor-{stable_hash(identity, 32)}.pt"

    def _load_or_compute(self, model) -> torch.Tensor:
        path = self.path = self._cache_path()
        # one decision for all ranks: a rank that computes waits for the others' rows
        if all_ranks(path.exists(), self.trainer.args.device):
            LOG.info(f"POFE: loading SPPO anchor log-probs from {path}")
            table = load_table(path)
            bad = nonfinite_rows(table, self._datasets())
            if bad:
                raise ValueError(
                    f"the cached SPPO anchor table {path} has no finite log-prob for rows (row_id) "
                    f"{_listed(bad)}; training on it would give NaN losses. Delete the file: the next run "
                    "computes the table again from the policy (before its first update)."
                )
            return table
        step = self.trainer.state.global_step
        if step > 0:
            # the policy has trained: its log-probs are no longer pi_t's
            raise RuntimeError(
                f"SPPO's anchor is the policy before training, but this run resumes at step "
                f"{step} and no anchor table for its rows and model is cached at {path}. "
                "Restore the table computed at step 0 (same model, same prepared data), or "
                "start the training over without resume_from_checkpoint."
            )
        table = self.compute(model)
        bad = nonfinite_rows(table, self._datasets())
        if bad:
            raise RuntimeError(
                f"the policy gives non-finite SPPO anchor log-probs for rows (row_id) {_listed(bad)} "
                f"(not cached). Check those rows' responses, and the model: its weights (NaN?), its "
                "dtype (fp16 overflows where bf16 or fp32 does not)."
            )
        if self.trainer.accelerator.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(table, tmp)
            os.replace(tmp, path)  # atomic: a killed run never leaves half a table
            LOG.info(f"POFE: cached SPPO anchor log-probs at {path}")
        return table

    @torch.no_grad()
    def compute(self, model, sort_by_length: bool = True) -> torch.Tensor:
        """One no-grad pass over every row of the train and eval sets (eval mode).

        Rows are batched longest first (`length_sorted_batches`; `sort_by_length=False`: in
        dataset order): the table is indexed by row_id, so the order is free, and batches of
        like lengths carry less padding. Batch b of a dataset is scored by rank b % world_size.
        Every rank makes the same number of forward calls (ZeRO-3 and FSDP gather each layer's
        weights from all ranks in each one): a rank short of a batch scores batch 0 again and
        drops it.
        """
        trainer = self.trainer
        args = trainer.args
        rank, world = rank_and_world()
        datasets = self._datasets()
        num_rows = 1 + max(max(d["row_id"]) for d in datasets)
        k_max = max(max(len(r) for r in d["response_ids"]) for d in datasets)
        table = torch.full((num_rows, k_max), float("nan"))
        written = torch.zeros(table.shape, dtype=torch.bool)
        batch_size = args.per_device_eval_batch_size
        rounds = [math.ceil(math.ceil(len(d) / batch_size) / world) for d in datasets]
        progress = tqdm(total=sum(rounds), desc="POFE anchor log-probs", disable=rank != 0 or args.disable_tqdm)
        started = time.perf_counter()
        was_training = model.training
        model.eval()
        try:
            for dataset, n_rounds in zip(datasets, rounds):
                order = row_order(dataset, batch_size) if sort_by_length else list(range(len(dataset)))
                for i in range(n_rounds):
                    start = (i * world + rank) * batch_size
                    keep = start < len(dataset)
                    start = start if keep else 0
                    rows = dataset.select(order[start : start + batch_size])
                    batch = trainer.data_collator(list(rows))
                    batch = {k: v.to(args.device) for k, v in batch.items()}
                    logp, _ = trainer.score_candidates(model, batch)  # (B, K)
                    progress.update()
                    if keep:
                        row_ids, k = batch["row_id"].cpu(), logp.shape[1]
                        table[row_ids, :k] = logp.float().cpu()
                        written[row_ids, :k] = True
        finally:
            model.train(was_training)
            progress.close()
        table = merge_rows(table, written, args.device)
        LOG.info(
            f"POFE: computed SPPO anchor log-probs for {num_rows} rows in "
            f"{time.perf_counter() - started:.1f} s on {world} process(es)"
        )
        return table


def row_tokens(dataset) -> list[int]:
    """Tokens in each row of `dataset` (its prompt and all its responses), read from arrow
    without building Python lists of the ids."""
    out: list[int] = []
    arrow = dataset.select_columns(["prompt_ids", "response_ids"]).with_format("arrow")
    for batch in arrow.iter(batch_size=4096):
        responses = batch["response_ids"].combine_chunks()
        per_response = pa.compute.list_value_length(pa.compute.list_flatten(responses)).to_numpy(zero_copy_only=False)
        row_of = pa.compute.list_parent_indices(responses).to_numpy(zero_copy_only=False)
        tokens = torch.zeros(len(batch), dtype=torch.long).index_add_(
            0, torch.from_numpy(row_of.astype("int64")), torch.from_numpy(per_response.astype("int64"))
        )
        prompts = pa.compute.list_value_length(batch["prompt_ids"]).to_numpy(zero_copy_only=False)
        out.extend((tokens + torch.from_numpy(prompts.astype("int64"))).tolist())
    return out


def row_order(dataset, batch_size: int) -> list[int]:
    """`dataset`'s row positions, longest row first, in batches of `batch_size` one after another."""
    return [n for batch in length_sorted_batches(row_tokens(dataset), batch_size) for n in batch]


def nonfinite_rows(table: torch.Tensor, datasets) -> list[int]:
    """The row_ids whose candidates have a non-finite (or no) entry in `table`, (num_rows,
    K_max); a row's slots past its own k are padding (NaN by design) and not read."""
    bad: set[int] = set()
    for dataset in datasets:
        arrow = dataset.select_columns(["row_id", "response_ids"]).with_format("arrow")
        for batch in arrow.iter(batch_size=4096):
            rows = torch.tensor(batch["row_id"].to_pylist())  # (N,)
            ks = torch.tensor(pa.compute.list_value_length(batch["response_ids"]).to_pylist())  # (N,)
            fits = (rows < table.shape[0]) & (ks <= table.shape[1])
            bad.update(rows[~fits].tolist())
            rows, ks = rows[fits], ks[fits]
            padding = torch.arange(table.shape[1]) >= ks[:, None]  # (N, K_max)
            ok = (torch.isfinite(table[rows]) | padding).all(dim=1)  # (N,)
            bad.update(rows[~ok].tolist())
    return sorted(bad)


def _listed(rows: list[int], most: int = 20) -> str:
    return ", ".join(map(str, rows[:most])) + (f" and {len(rows) - most} more" if len(rows) > most else "")


def load_table(path: Path) -> torch.Tensor:
    """The cached anchor table at `path`: a (rows, K) float tensor. A file that is not one (cut
    short, damaged, or another program's) is refused by name, with what to do; torch's own
    error would suggest `weights_only=False`, i.e. running what the file holds."""
    redo = "Delete the file: the next run computes the table again from the policy (before its first update)."
    try:
        table = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise ValueError(
            f"the cached SPPO anchor table {path} cannot be read ({type(e).__name__}: cut short, "
            f"damaged, or not a table POFE wrote). {redo}"
        ) from None
    if not (isinstance(table, torch.Tensor) and table.dim() == 2 and table.is_floating_point()):
        shape = f"a tensor of shape {tuple(table.shape)}" if isinstance(table, torch.Tensor) else type(table).__name__
        raise ValueError(f"the cached SPPO anchor table {path} holds {shape}, not a (rows, K) float table. {redo}")
    return table


def rows_digest(dataset, columns=("row_id", "prompt_ids", "response_ids")) -> str:
    """sha256 of the token columns of `dataset`, in row order.

    The same rows give the same digest however the dataset was made (prepared in this
    run, or loaded from disk after a restart: `datasets` fingerprints differ there). The
    schema's metadata is left out: `datasets` writes the fingerprint into it (a freshly
    mapped or flattened dataset's, none for one loaded from disk), and a resumed run would
    then miss the anchor table cached at step 0; so are the chunk boundaries.
    """
    digest = hashlib.sha256()
    arrow = dataset.select_columns(list(columns)).with_format("arrow")
    for batch in arrow.iter(batch_size=4096):  # pa.Table slices, serialised by content only
        batch = batch.replace_schema_metadata(None).combine_chunks()
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_table(batch)
        digest.update(sink.getvalue())
    return digest.hexdigest()
