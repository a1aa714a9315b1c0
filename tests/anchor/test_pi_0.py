"""pi_0's log-probs for SPPO's mixed anchor (`pofe.anchor.pi_0`): which pass gives them, and
the pass that loads pi_0 apart, scored against a plain forward of each response."""

from __future__ import annotations

import pytest
import torch
from axolotl.utils.dict import DictDefault
from datasets import Dataset

from pofe.anchor.pi_0 import pi_0_route, prepare_pi_0_table
from pofe.anchor.table import RowScorer
from pofe.demo.tiny import build_tiny_model, build_tokenizer
from tests.helpers import HIDDEN, assert_float_close, naive_logps


def _cfg(tmp_path, base_model, lora_model_dir=None):
    return DictDefault(
        base_model=str(base_model), lora_model_dir=lora_model_dir, dataset_prepared_path=str(tmp_path / "prep")
    )


def test_base_route(tmp_path):
    """pi_0 = pi_0, else base_model. The policy itself when no adapter is loaded and pi_0
    is its base_model (the same folder, however spelled), or when pi_0 names the loaded adapter;
    the adapter disabled when an adapter sits on pi_0; loaded apart otherwise."""
    base, adapter, sft = (tmp_path / name for name in ("base", "adapter", "sft"))
    for folder in (base, adapter, sft):
        folder.mkdir()
    spelled = str(tmp_path / "adapter" / ".." / "base")
    assert pi_0_route(_cfg(tmp_path, base), None) == "policy"
    assert pi_0_route(_cfg(tmp_path, base), spelled) == "policy"
    assert pi_0_route(_cfg(tmp_path, base), str(sft)) == "apart"
    assert pi_0_route(_cfg(tmp_path, base, str(adapter)), None) == "adapter"
    assert pi_0_route(_cfg(tmp_path, base, str(adapter)), spelled) == "adapter"
    assert pi_0_route(_cfg(tmp_path, base, str(adapter)), str(adapter)) == "policy"
    assert pi_0_route(_cfg(tmp_path, base, str(adapter)), str(sft)) == "apart"
    assert pi_0_route(_cfg(tmp_path, "org/base"), "org/base") == "policy"
    assert pi_0_route(_cfg(tmp_path, "org/base"), "org/sft") == "apart"


def _rows():
    """Three rows of 2, 3 and 1 responses (row_ids 0, 2, 1: the table is indexed by row_id)."""
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(4, 30, (n,), generator=g).tolist()  # noqa: E731
    return Dataset.from_dict(
        {
            "row_id": [0, 2, 1],
            "prompt_ids": [ids(5), ids(3), ids(8)],
            "response_ids": [[ids(4), ids(2)], [ids(3), ids(6), ids(1)], [ids(5)]],
            "win_rates": [[0.5, 0.5], [0.2, 0.5, 0.8], [0.5]],
        }
    )


def _scorer(prefix_sharing: bool):
    from pofe.collator import KResponseCollator
    from pofe.scoring import score_candidates

    return RowScorer(
        collate=KResponseCollator(build_tokenizer(), prefix_sharing=prefix_sharing),
        score=lambda model, batch: score_candidates(model, batch),
        batch_size=2,
        device=torch.device("cpu"),
        progress=False,
    )


@pytest.mark.parametrize("prefix_sharing", [True, False])
def test_pi_0_loaded_apart_scores_every_candidate_once(tmp_path, tiny64_model, one_torch_thread, prefix_sharing):
    """The route "apart" loads pi_0 (another tiny model), scores every candidate and caches the
    table; each entry equals a plain forward of that response under pi_0 (float32, width x
    tokens summed: `float_tolerance`; slots past a row's own k are padding, which nothing reads,
    and are not compared). A second call finds the cache and loads no model."""
    from transformers import AutoModelForCausalLM

    import pofe.anchor.pi_0 as pi_0

    sft = build_tiny_model(tmp_path / "sft", hidden_size=64, seed=1)
    cfg = _cfg(tmp_path, tiny64_model)
    rows = _rows()
    path = prepare_pi_0_table(cfg, str(sft), [rows, None], _scorer(prefix_sharing))
    assert path is not None and path.name.startswith("pofe-pi0-") and path.parent == tmp_path / "prep"
    table = torch.load(path, weights_only=True)
    expected = naive_logps(AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32).eval(), rows)
    tokens = max(len(r["prompt_ids"]) + sum(map(len, r["response_ids"])) for r in rows)
    real = expected.isfinite()
    assert_float_close(table.where(real, float("nan")), expected, HIDDEN * tokens)
    # the policy (tiny64_model) scores them otherwise (by up to 0.84 here, against a tolerance of
    # 4e-4): the table is pi_0's, not the policy's
    policy = naive_logps(AutoModelForCausalLM.from_pretrained(tiny64_model, dtype=torch.float32).eval(), rows)
    assert (expected - policy).nan_to_num().abs().max() > 0.1

    def no_second_load(*args, **kwargs):
        raise AssertionError("pi_0 loaded again although its table is cached")

    original = pi_0.compute_apart
    pi_0.compute_apart = no_second_load
    try:
        assert prepare_pi_0_table(cfg, str(sft), [rows], _scorer(prefix_sharing)) == path
    finally:
        pi_0.compute_apart = original
    # the policy's own model as pi_0: nothing to load apart (the anchor pass gives it)
    assert prepare_pi_0_table(cfg, str(tiny64_model), [rows], _scorer(prefix_sharing)) is None


def test_a_damaged_pi_0_table_is_refused_naming_the_file(tmp_path, tiny64_model, one_torch_thread):
    """A cached table with a NaN where a candidate is: refused, naming the file and what to do."""
    sft = build_tiny_model(tmp_path / "sft", hidden_size=64, seed=1)
    cfg, rows = _cfg(tmp_path, tiny64_model), _rows()
    path = prepare_pi_0_table(cfg, str(sft), [rows], _scorer(True))
    table = torch.load(path, weights_only=True)
    table[2, 1] = float("nan")
    torch.save(table, path)
    with pytest.raises(ValueError, match=r"pi_0 table .*pofe-pi0-.* has no finite log-prob for rows \(row_id\) 2"):
        prepare_pi_0_table(cfg, str(sft), [rows], _scorer(True))
