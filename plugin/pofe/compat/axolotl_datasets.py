"""axolotl's dataset pipeline, run by POFE's loader as `axolotl preprocess` runs it for
axolotl's own datasets: the hash that names a prepared dataset, its folder, loading and saving
it, merging, the validation split, and the lock under which one rank prepares."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pofe.compat.registry import ENTRIES, Entry

ENTRIES["axolotl_datasets"] = Entry(
    reaches="axolotl: axolotl.utils.data.shared (generate_dataset_hash_from_config, get_prepared_dataset_path, "
    "load_preprocessed_dataset, save_preprocessed_dataset, merge_datasets, create_train_validation_split, "
    "get_dataset_type, load_dataset_with_config) and axolotl.utils.data.lock.FileLockLoader, internal modules "
    "whose functions POFE's loader calls in axolotl's order",
    names=("axolotl.utils.data",),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl's plugin API hands a plugin's dataset loader these steps (a prepared-dataset cache and "
    "a rank lock)",
)


def axolotl_dataset_hash(cfg, tokenizer_name: str) -> str:
    """axolotl's hash of `cfg.datasets` and the tokenizer, which names their prepared folder."""
    from axolotl.utils.data.shared import generate_dataset_hash_from_config

    return generate_dataset_hash_from_config(cfg, cfg.datasets, tokenizer_name)


def prepared_path(cfg, dataset_hash: str) -> Path:
    from axolotl.utils.data.shared import get_prepared_dataset_path

    return get_prepared_dataset_path(cfg, dataset_hash)


def load_prepared(cfg, dataset_hash: str):
    """The prepared dataset saved under `dataset_hash`, or None."""
    from axolotl.utils.data.shared import load_preprocessed_dataset

    return load_preprocessed_dataset(cfg, dataset_hash)


def save_prepared(cfg, dataset, dataset_hash: str) -> None:
    from axolotl.utils.data.shared import save_preprocessed_dataset

    save_preprocessed_dataset(cfg, dataset, dataset_hash, "train")


def merge_entries(parts: list, cfg):
    """The datasets of every entry as one (shuffled as `cfg` says)."""
    from axolotl.utils.data.shared import merge_datasets

    return merge_datasets(parts, cfg)


def split_validation(dataset, cfg) -> tuple[Any, Any]:
    """(train, validation) by `cfg.val_set_size`."""
    from axolotl.utils.data.shared import create_train_validation_split

    return create_train_validation_split(dataset, cfg, cfg.val_set_size)


def is_json(entry) -> bool:
    """Whether axolotl reads a `datasets:` entry as JSON."""
    from axolotl.utils.data.shared import get_dataset_type

    return get_dataset_type(entry) == "json"


def load_with_axolotl(entry, use_auth_token: bool):
    """A `datasets:` entry loaded as axolotl loads it (hub, local folder, cloud storage, ...)."""
    from axolotl.utils.data.shared import load_dataset_with_config

    return load_dataset_with_config(entry, use_auth_token)


def load_under_lock(cfg, load: Callable[[], Any]) -> Any:
    """`load()` under axolotl's dataset lock: the first rank runs it, the others wait and load its result."""
    from axolotl.utils.data.lock import FileLockLoader

    loader = FileLockLoader(cfg)
    try:
        return loader.load(load)
    finally:
        loader.cleanup()
