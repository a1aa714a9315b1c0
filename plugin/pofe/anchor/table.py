"""Tables of log-probs per (row, candidate): one no-grad pass over the tokenised rows, cached.

The machinery behind SPPO's anchor table (`pofe.anchor.AnchorLogps`) and pi_0's
(`pofe.anchor.pi_0`): the pass (`score_rows`, sharded over ranks), where a table is cached
(`table_path`: beside the prepared data, keyed on the model's weights as well as the config,
`pofe.files.weights_fingerprint`, and on the tokenised rows' content, `rows_digest`), and the
checks on reading and writing one. No trainer here: a pass is given a model and a `RowScorer`.
"""

from __future__ import annotations

import hashlib
import io
import math
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import torch
from tqdm.auto import tqdm

from pofe.batching import length_sorted_batches
from pofe.distributed import merge_rows, rank_and_world
from pofe.files import stable_hash, write_atomic
from pofe.logs import get_logger

LOG = get_logger(__name__)

# Config keys that change the policy's log-probs, and so a cached table.
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


@dataclass(frozen=True)
class RowScorer:
    """What a no-grad pass over tokenised rows needs besides the model: how rows become a
    batch (`collate`, the training collator), how a batch is scored (`score`: (model, batch)
    -> (logp (B, K), lengths (B, K)), `pofe.scoring.score_candidates`), the batch size, the
    device batches go to, and whether to show the pass (`progress`: a progress bar and its time at
    INFO; an online refresh's passes show neither: one a refresh would flood the console, and their
    time is logged as online/score_seconds)."""

    collate: Callable[[list[dict]], dict[str, torch.Tensor]]
    score: Callable[[torch.nn.Module, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]
    batch_size: int
    device: torch.device | str
    progress: bool = True


@torch.no_grad()
def score_rows(
    model, datasets, scorer: RowScorer, what: str, *, sort_by_length: bool = True, ranks: tuple[int, int] | None = None
) -> torch.Tensor:
    """(num_rows, K_max) summed log-probs of every candidate of every row of `datasets`
    under `model`, indexed by row_id, NaN where a row has no candidate; one no-grad pass in
    eval mode. `what` names the table in the log ("SPPO anchor", "pi_0").

    Rows are batched longest first (`row_order`; `sort_by_length=False`: in dataset order):
    the table is indexed by row_id, so the order is free, and batches of like lengths carry
    less padding. `ranks`: (rank, world), default this process's (`rank_and_world`); batch b
    of a dataset is scored by rank b % world, and the ranks' rows are merged (a collective).
    Every rank makes the same number of forward calls (ZeRO-3 and FSDP gather each layer's
    weights from all ranks in each one): a rank short of a batch scores batch 0 again and
    drops it. A pass that runs on one process among several (`ranks=(0, 1)`) merges nothing.
    """
    rank, world = ranks or rank_and_world()
    num_rows = 1 + max(max(d["row_id"]) for d in datasets)
    k_max = max(max(len(r) for r in d["response_ids"]) for d in datasets)
    table = torch.full((num_rows, k_max), float("nan"))
    written = torch.zeros(table.shape, dtype=torch.bool)
    size = scorer.batch_size
    rounds = [math.ceil(math.ceil(len(d) / size) / world) for d in datasets]
    progress = tqdm(total=sum(rounds), desc=f"POFE {what} log-probs", disable=rank != 0 or not scorer.progress)
    started = time.perf_counter()
    was_training = model.training
    model.eval()
    try:
        for dataset, n_rounds in zip(datasets, rounds):
            order = row_order(dataset, size) if sort_by_length else list(range(len(dataset)))
            for i in range(n_rounds):
                start = (i * world + rank) * size
                keep = start < len(dataset)
                start = start if keep else 0
                batch = scorer.collate(list(dataset.select(order[start : start + size])))
                batch = {k: v.to(scorer.device) for k, v in batch.items()}
                logp, _ = scorer.score(model, batch)  # (B, K)
                progress.update()
                if keep:
                    row_ids, k = batch["row_id"].cpu(), logp.shape[1]
                    table[row_ids, :k] = logp.float().cpu()
                    written[row_ids, :k] = True
    finally:
        model.train(was_training)
        progress.close()
    if world > 1:
        table = merge_rows(table, written, scorer.device)
    (LOG.info if scorer.progress else LOG.debug)(
        f"POFE: computed {what} log-probs for {num_rows} rows in "
        f"{time.perf_counter() - started:.1f} s on {world} process(es)"
    )
    return table


def table_path(cfg, datasets, kind: str, weights: list, **identity) -> Path:
    """Where a table of `kind` ("anchor", "pi_0") is cached: beside the prepared data, named by
    a hash of the config keys that change log-probs (`MODEL_IDENTITY_KEYS`), the rows' content
    (`rows_digest`), the `weights` it was scored with (`pofe.files.weights_fingerprint`) and any
    further `identity`. The anchor's name keeps its form (no kind in the hash), so a table cached
    before pi_0's existed is still found."""
    key = {name: str(cfg.get(name)) for name in MODEL_IDENTITY_KEYS}
    key["data"] = [rows_digest(d) for d in datasets]
    key["weights"] = weights
    if kind != "anchor":
        key.update(kind=kind, **identity)
    prepared = Path(cfg.dataset_prepared_path or "last_run_prepared")
    return prepared / f"pofe-{kind.replace('_', '')}-{stable_hash(key, 32)}.pt"


def cached_table(path: Path, datasets, what: str, redo: str) -> torch.Tensor:
    """The table at `path`, checked: every candidate of `datasets` has a finite entry. `redo`:
    what deleting the file makes the next run do."""
    table = load_table(path, what, redo)
    bad = nonfinite_rows(table, datasets)
    if bad:
        raise ValueError(
            f"the cached {what} table {path} has no finite log-prob for rows (row_id) {listed(bad)}; "
            f"training on it would give NaN losses. Delete the file: {redo}"
        )
    return table


def checked_table(table: torch.Tensor, datasets, who: str, what: str) -> torch.Tensor:
    """A freshly computed `table` of `what` ("SPPO anchor") log-probs, refused (not cached) when a
    candidate of `datasets` has no finite log-prob in it; `who` names the model that scored it."""
    bad = nonfinite_rows(table, datasets)
    if bad:
        raise RuntimeError(
            f"{who} gives non-finite {what} log-probs for rows (row_id) {listed(bad)} (not cached). "
            "Check those rows' responses, and the model: its weights (NaN?), its dtype (fp16 overflows "
            "where bf16 or fp32 does not)."
        )
    return table


def save_table(path: Path, table: torch.Tensor) -> None:
    """Write `table` to `path` atomically (`write_atomic`): a killed run never leaves half a table,
    and a full disk is named, its temporary file removed. Serialised in memory first (rows x K
    floats), as torch.save's own file writer reports a full disk as an iostream error naming nothing."""
    buffer = io.BytesIO()
    torch.save(table, buffer)
    write_atomic(path, buffer.getvalue())


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


def listed(rows: list[int], most: int = 20) -> str:
    return ", ".join(map(str, rows[:most])) + (f" and {len(rows) - most} more" if len(rows) > most else "")


ANCHOR_REDO = "the next run computes the table again from the policy (before its first update)."


def load_table(path: Path, what: str = "SPPO anchor", redo: str = ANCHOR_REDO) -> torch.Tensor:
    """The cached table at `path`: a (rows, K) float tensor. A file that is not one (cut
    short, damaged, or another program's) is refused by name, with what to do (`redo`: what
    deleting it makes the next run do); torch's own error would suggest `weights_only=False`,
    i.e. running what the file holds."""
    redo = f"Delete the file: {redo}"
    try:
        table = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        raise ValueError(
            f"the cached {what} table {path} cannot be read ({type(e).__name__}: cut short, "
            f"damaged, or not a table POFE wrote). {redo}"
        ) from None
    if not (isinstance(table, torch.Tensor) and table.dim() == 2 and table.is_floating_point()):
        shape = f"a tensor of shape {tuple(table.shape)}" if isinstance(table, torch.Tensor) else type(table).__name__
        raise ValueError(f"the cached {what} table {path} holds {shape}, not a (rows, K) float table. {redo}")
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
