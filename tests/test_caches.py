"""Caches keyed on content: what the files hold, not only what the config names."""

from __future__ import annotations

import json
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
