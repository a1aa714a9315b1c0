"""Caches keyed on content: what the files hold, not only what the config names."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import yaml

from axolotl.cli.config import prepare_plugins
from axolotl.utils.config import validate_config
from axolotl.utils.dict import DictDefault

from pofe.data.loader import prepared_dataset_hash
from tests.helpers import recipe

CPU = {"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}


def test_prepared_dataset_follows_the_data_file_content(tmp_path, tiny_model):
    """A data file edited in place used to reuse the dataset prepared from its old rows."""
    data = tmp_path / "rows.jsonl"
    row = {"prompt": "2+2=", "responses": ["4", "5"], "rewards": [1.0, 0.0]}
    data.write_text(json.dumps(row) + "\n")
    cfg = DictDefault(yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf").read_text()))
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"})
    tokenizer = SimpleNamespace(name_or_path=str(tiny_model), chat_template="{{ messages }}")

    before = prepared_dataset_hash(cfg, tokenizer)
    data.write_text(json.dumps({**row, "rewards": [0.0, 1.0]}) + "\n")
    edited = prepared_dataset_hash(cfg, tokenizer)
    assert edited != before
    data.write_text(json.dumps(row) + "\n")  # the same rows again: the same cache
    assert prepared_dataset_hash(cfg, tokenizer) == before


def test_local_files_digest_covers_folders_and_skips_hub_names(tmp_path):
    from pofe.data.sources import local_files_digest

    folder = tmp_path / "saved"
    (folder / "part").mkdir(parents=True)
    (folder / "part" / "a.arrow").write_bytes(b"rows")
    entries = [DictDefault(path=str(folder)), DictDefault(path="UCLA-AGI/data-mistral-7b")]
    first, hub = local_files_digest(entries)
    assert hub is None  # a hub dataset is named by its revision
    (folder / "part" / "a.arrow").write_bytes(b"ROWS")
    assert local_files_digest(entries)[0] != first
    (folder / "part" / "a.arrow").unlink()
    (folder / "part" / "b.arrow").write_bytes(b"rows")  # the first bytes, under a new name
    assert local_files_digest(entries)[0] != first


def _anchor_for(tmp_path, base_model, calls):
    """An AnchorLogps on a stand-in trainer whose anchor pass records that it ran."""
    import torch

    from pofe.anchor import AnchorLogps

    trainer = SimpleNamespace(
        axolotl_cfg=DictDefault(base_model=str(base_model), dataset_prepared_path=str(tmp_path / "prep")),
        train_dataset=SimpleNamespace(_fingerprint="rows-v1"),
        eval_dataset=None,
        accelerator=SimpleNamespace(is_main_process=True),
    )
    anchor = AnchorLogps(trainer)
    anchor.compute = lambda model: calls.append(model) or torch.full((2, 2), float(len(calls)))
    return anchor


def test_anchor_table_follows_the_weights_at_the_same_path(tmp_path):
    """New weights at the same base_model path used to reuse the old anchor table."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    weights = model / "model.safetensors"
    weights.write_bytes(b"\x00" * 3_000_000)
    calls = []
    first = _anchor_for(tmp_path, model, calls)._load_or_compute("policy")
    again = _anchor_for(tmp_path, model, calls)._load_or_compute("policy")
    assert len(calls) == 1 and again.equal(first)  # the same weights: the cached table

    # new weights, same size, written back with the old mtime: only the bytes differ
    stat = weights.stat()
    weights.write_bytes(b"\x00" * 1_500_000 + b"\x01" + b"\x00" * 1_499_999)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    fresh = _anchor_for(tmp_path, model, calls)._load_or_compute("policy")
    assert len(calls) == 2 and not fresh.equal(first)
