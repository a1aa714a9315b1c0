"""Caches keyed on content: what the files hold, not only what the config names."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import yaml
from axolotl.cli.config import prepare_plugins
from axolotl.utils.config import validate_config
from axolotl.utils.dict import DictDefault

from pofe.args import pofe_config
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

    before = prepared_dataset_hash(cfg, pofe_config(cfg), tokenizer)
    data.write_text(json.dumps({**row, "rewards": [0.0, 1.0]}) + "\n")
    edited = prepared_dataset_hash(cfg, pofe_config(cfg), tokenizer)
    assert edited != before
    data.write_text(json.dumps(row) + "\n")  # the same rows again: the same cache
    assert prepared_dataset_hash(cfg, pofe_config(cfg), tokenizer) == before


def test_a_small_prepared_dataset_is_saved_in_process_and_loaded_back(tmp_path, tiny_model, monkeypatch):
    """Under 512 rows POFE saves the prepared rows itself (axolotl's helper would spawn a pool
    of one process to do it); axolotl's `load_preprocessed_dataset` finds them at its own path,
    so the second load prepares nothing, and the rows are the ones prepared. No process starts."""
    import multiprocess  # datasets' pools (dill's multiprocessing)
    from axolotl.utils.data.shared import get_prepared_dataset_path
    from transformers import AutoTokenizer

    from pofe.data import loader

    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": f"{i}+1=", "responses": [str(i + 1), "0"], "rewards": [1.0, 0.0]} for i in range(6)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DictDefault(yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf").read_text()))
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"})
    pcfg, tokenizer = pofe_config(cfg), AutoTokenizer.from_pretrained(tiny_model)
    dataset_hash = prepared_dataset_hash(cfg, pcfg, tokenizer)

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started to save 6 rows")

    monkeypatch.setattr(multiprocess.context.SpawnContext, "Pool", no_process)
    prepared = loader._load_or_prepare(cfg, pcfg, tokenizer, dataset_hash)
    assert (get_prepared_dataset_path(cfg, dataset_hash) / "dataset_info.json").exists()

    def not_again(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(loader, "_prepare", not_again)
    assert loader._load_or_prepare(cfg, pcfg, tokenizer, dataset_hash).to_list() == prepared.to_list()
    assert len(prepared) == 6


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


def _token_rows(responses=((5, 6), (7,))):
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "row_id": [0],
            "prompt_ids": [[1, 2]],
            "response_ids": [[list(r) for r in responses]],
            "win_rates": [[1.0, 0.0]],
        }
    )


def _anchor_for(tmp_path, base_model, calls, step=0):
    """An AnchorLogps on a stand-in trainer whose anchor pass records that it ran."""
    import torch

    from pofe.anchor import AnchorLogps

    trainer = SimpleNamespace(
        axolotl_cfg=DictDefault(base_model=str(base_model), dataset_prepared_path=str(tmp_path / "prep")),
        train_dataset=_token_rows(),
        eval_dataset=None,
        accelerator=SimpleNamespace(is_main_process=True),
        args=SimpleNamespace(device="cpu"),
        state=SimpleNamespace(global_step=step),
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


def test_rows_digest_follows_content_not_fingerprint(tmp_path):
    """A dataset prepared in the run and the same rows loaded from disk after a restart
    have different `datasets` fingerprints; the anchor cache must find the same table."""
    import pyarrow as pa
    from datasets import Dataset, load_from_disk

    from pofe.anchor import rows_digest

    rows = _token_rows()
    rows.save_to_disk(tmp_path / "saved")
    reloaded = load_from_disk(tmp_path / "saved")
    assert reloaded._fingerprint != rows._fingerprint
    assert rows_digest(reloaded) == rows_digest(rows)
    # flattening (as a `map` does) writes the new fingerprint into the schema's metadata: a
    # run that prepared its data in-process cached its anchor table under another key than
    # its resumed start, which loads the data from disk, looked up
    flat = reloaded.flatten_indices()
    assert b"fingerprint" in flat.data.table.schema.metadata[b"huggingface"]
    assert rows_digest(flat) == rows_digest(rows)
    rechunked = Dataset(pa.concat_tables([flat.data.table] * 2)).select([1])  # two chunks, the second row
    assert rows_digest(rechunked) == rows_digest(rows)
    assert rows_digest(_token_rows(((5, 6), (8,)))) != rows_digest(rows)  # one token differs
    # a selection holds only the rows it selects
    two = _token_rows().add_item({"row_id": 1, "prompt_ids": [3], "response_ids": [[4]], "win_rates": [0.5]})
    assert rows_digest(two.select([0])) == rows_digest(rows)


def test_anchor_is_never_computed_from_a_trained_policy(tmp_path):
    """A run resumed at step 3 whose anchor table is missing would otherwise take the
    partly trained checkpoint as pi_t (sppo/logratio 0 at the resumed step)."""
    import pytest
    import torch

    calls = []
    anchor = _anchor_for(tmp_path, tmp_path / "absent-model", calls, step=3)
    with pytest.raises(RuntimeError, match="resumes at step 3"):
        anchor._load_or_compute("policy")
    assert calls == []
    _anchor_for(tmp_path, tmp_path / "absent-model", calls, step=0)._load_or_compute("policy")
    resumed = _anchor_for(tmp_path, tmp_path / "absent-model", calls, step=3)._load_or_compute("policy")
    assert len(calls) == 1 and resumed.equal(torch.full((2, 2), 1.0))  # the step-0 table


def test_nan_anchor_table_is_refused_at_load_naming_the_file(tmp_path):
    """Bad case 5 of issue 20: a cached table of NaN trained a NaN model and exited 0. Row 0
    has k = 2 (the fixture's rows): NaN past column 2 is padding and passes; NaN in its
    candidates' columns is refused, naming the file and what to do (delete it)."""
    import pytest
    import torch

    calls = []
    anchor = _anchor_for(tmp_path, tmp_path / "absent-model", calls)
    path = anchor._cache_path()
    path.parent.mkdir(parents=True)
    torch.save(torch.tensor([[-1.0, -2.0, float("nan")]]), path)  # (1, 3): column 2 is padding
    assert anchor._load_or_compute("policy").shape == (1, 3)
    torch.save(torch.tensor([[-1.0, float("nan")]]), path)
    with pytest.raises(
        ValueError, match=rf"anchor table {path} has no finite log-prob for rows \(row_id\) 0.*Delete the file"
    ):
        _anchor_for(tmp_path, tmp_path / "absent-model", calls)._load_or_compute("policy")
    assert calls == []


def test_nan_anchor_pass_is_refused_and_not_cached(tmp_path):
    import pytest
    import torch

    anchor = _anchor_for(tmp_path, tmp_path / "absent-model", [])
    anchor.compute = lambda model: torch.tensor([[float("inf"), -2.0]])
    with pytest.raises(RuntimeError, match=r"non-finite SPPO anchor log-probs for rows \(row_id\) 0 \(not cached\)"):
        anchor._load_or_compute("policy")
    assert not anchor._cache_path().exists()


def test_a_damaged_anchor_table_is_refused_naming_the_file(tmp_path):
    """Weak case of issue 20: a cut-short anchor .pt gave torch's UnpicklingError advice to
    load it with weights_only=False (running what the file holds). Now: the file, why, and
    what to do; a file of another shape is refused as well."""
    import re

    import pytest
    import torch

    calls = []
    anchor = _anchor_for(tmp_path, tmp_path / "absent-model", calls)
    path = anchor._cache_path()
    path.parent.mkdir(parents=True)
    torch.save(torch.tensor([[-1.0, -2.0]]), path)
    whole = path.read_bytes()
    for damaged, why in ((whole[: len(whole) // 2], "cannot be read"), (b"\x80\x04not a table", "cannot be read")):
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match=rf"anchor table {re.escape(str(path))} {why}.*Delete the file") as e:
            _anchor_for(tmp_path, tmp_path / "absent-model", calls)._load_or_compute("policy")
        assert "weights_only" not in str(e.value)
    torch.save(torch.tensor([1.0, 2.0]), path)
    with pytest.raises(ValueError, match=r"holds a tensor of shape \(2,\), not a \(rows, K\) float table"):
        _anchor_for(tmp_path, tmp_path / "absent-model", calls)._load_or_compute("policy")
    assert calls == []


def test_preparing_rows_warns_about_opposite_labels_and_keeps_only_training_columns(tmp_path, tiny_model, caplog):
    """The loader's own path: the text digests ride along for the cross-row check, then go."""
    from transformers import AutoTokenizer

    from pofe.data.loader import LOG, _prepare

    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": "2+2=", "responses": ["4", "5"], "rewards": r} for r in ([1.0, 0.0], [0.0, 1.0])]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DictDefault(yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf").read_text()))
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"})
    LOG.logger.addHandler(caplog.handler)
    try:
        dataset = _prepare(cfg, pofe_config(cfg), AutoTokenizer.from_pretrained(tiny_model))
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert len(dataset) == 2 and not {"prompt_key", "response_keys", "keep"} & set(dataset.column_names)
    assert (
        "1 of 2 rows of" in caplog.text
        and "opposite order to an earlier row with the same prompt (rows (0, 1))" in caplog.text
    )


def _validated(raw: dict):
    cfg = DictDefault(raw)
    prepare_plugins(cfg)
    return validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"})


def _prompts_recipe(tmp_path, tiny_model, method: str, **pofe) -> dict:
    """A CPU recipe from prompts (pofe.prompts, a python judge), with `pofe` keys added."""
    data = tmp_path / "prompts.jsonl"
    if not data.exists():
        data.write_text(json.dumps({"prompt": "2+2="}) + "\n")
    raw = yaml.safe_load(recipe(tmp_path, tiny_model, method, data, "pofe.prompts").read_text())
    raw["pofe"] = {
        "generate": {"backend": "transformers", **pofe.pop("generate", {})},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
        **pofe,
    }
    return raw


def test_candidate_folders_are_named_by_the_settings_as_resolved(tmp_path, tiny_model):
    """Issue 34: the name was hashed before the per-method `dedupe` default was filled in, so
    RRHF (dedupe on) and SPPO (off) on one prepared path shared a folder, and the second
    preprocess stopped on its manifest. Now: resolved settings and the method name it."""
    from pofe.data.candidates import candidates_dir

    def folder(method, **pofe):
        cfg = _validated(_prompts_recipe(tmp_path, tiny_model, method, **pofe))
        template = SimpleNamespace(chat_template="{{ messages }}")
        return candidates_dir(cfg, pofe_config(cfg), cfg.datasets[0], str(tiny_model), "prompt", "chat", template)

    rrhf = folder("rrhf")
    assert rrhf.parent == tmp_path / "prepared" and rrhf.name.startswith("pofe-candidates-")
    assert folder("sppo") != rrhf
    # the same settings, one stated and one left to the method's default: one folder
    assert folder("rrhf", generate={"dedupe": True}) == rrhf
    assert folder("rrhf", candidates={"truncated": "keep"}) == rrhf
    assert folder("rrhf", generate={"dedupe": False}) != rrhf
    assert folder("sppo", generate={"dedupe": False}) == folder("sppo")
    # an edited prompt file is other inputs: a folder of its own, not a mismatch
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "3+3="}) + "\n")
    assert folder("rrhf") != rrhf


def test_prepared_rows_are_keyed_on_the_settings_as_resolved(tmp_path, tiny_model):
    """A default stated or left out prepares the same rows: one cache; a real change: another."""
    tokenizer = SimpleNamespace(name_or_path=str(tiny_model), chat_template="{{ messages }}")

    def key(method, **pofe):
        cfg = _validated(_prompts_recipe(tmp_path, tiny_model, method, **pofe))
        return prepared_dataset_hash(cfg, pofe_config(cfg), tokenizer)

    rrhf = key("rrhf")
    assert key("rrhf", generate={"dedupe": True}) == rrhf
    assert key("rrhf", max_prompt_len=32) == rrhf  # the recipe's sequence_len 64 // 2
    assert key("rrhf", max_prompt_len=16) != rrhf
    assert key("rrhf", generate={"dedupe": False}) != rrhf
    assert key("sppo") != rrhf
