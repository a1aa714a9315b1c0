"""Length-sorted batches: the helper by hand, and SPPO's anchor pass in sorted batches giving
the table of dataset order (the judges' sorted batches: tests/candidates/test_pairrm.py and
tests/candidates/test_reward_model_cut.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pofe.batching import length_sorted_batches
from tests.helpers import assert_float_close


def test_length_sorted_batches_by_hand():
    # lengths 3 9 1 9 4: longest first, the two 9s in index order, then 4, 3, 1
    assert length_sorted_batches([3, 9, 1, 9, 4], 2) == [[1, 3], [4, 0], [2]]
    assert length_sorted_batches([3, 9, 1, 9, 4], 5) == [[1, 3, 4, 0, 2]]
    assert length_sorted_batches([], 4) == []
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        length_sorted_batches([1], 0)


def _rows(lengths: list[tuple[int, list[int]]]):
    """Rows with the given (prompt length, response lengths), random ids, row_id = position."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(5)
    ids = lambda n: torch.randint(7, 90, (n,), generator=g).tolist()  # noqa: E731
    return Dataset.from_dict(
        {
            "row_id": list(range(len(lengths))),
            "prompt_ids": [ids(p) for p, _ in lengths],
            "response_ids": [[ids(r) for r in rs] for _, rs in lengths],
            "win_rates": [[0.5] * len(rs) for _, rs in lengths],
        }
    )


# (prompt, responses): totals 6, 23, 9, 40, 8, 17, 31 tokens
LENGTHS = [(2, [2, 2]), (5, [6, 6, 6]), (3, [3, 3]), (8, [10, 12, 10]), (4, [4]), (9, [4, 4]), (7, [8, 8, 8])]


def test_row_tokens_and_order_by_hand():
    from pofe.anchor import row_order, row_tokens

    rows = _rows(LENGTHS)
    assert row_tokens(rows) == [6, 23, 9, 40, 8, 17, 31]
    assert row_order(rows, 3) == [3, 6, 1, 5, 2, 4, 0]
    assert row_tokens(rows.select([])) == []


def test_sorted_anchor_pass_gives_the_dataset_order_table(tiny64_model, tmp_path, one_torch_thread):
    """Batches of 3 rows: sorted [3, 6, 1] [5, 2, 4] [0], in dataset order [0, 1, 2] [3, 4, 5] [6].
    Each candidate's log-prob is the same up to float32 rounding (padding is masked; the
    matmuls' blocking differs with the batch's shape); padded slots (past a row's own k,
    written or not by the batch's width) are not compared: nothing reads them."""
    from axolotl.utils.dict import DictDefault
    from transformers import AutoModelForCausalLM

    from pofe.anchor import AnchorLogps
    from pofe.collator import KResponseCollator
    from pofe.demo.tiny import build_tokenizer
    from pofe.scoring import score_candidates

    calls: list[list[int]] = []

    def scored(model, batch):
        calls.append(batch["row_id"].tolist())
        return score_candidates(model, batch)

    trainer = SimpleNamespace(
        axolotl_cfg=DictDefault(base_model=str(tiny64_model), dataset_prepared_path=str(tmp_path)),
        train_dataset=_rows(LENGTHS),
        eval_dataset=None,
        accelerator=SimpleNamespace(is_main_process=True),
        args=SimpleNamespace(device=torch.device("cpu"), per_device_eval_batch_size=3, disable_tqdm=True),
        state=SimpleNamespace(global_step=0),
        data_collator=KResponseCollator(build_tokenizer()),
        score_candidates=scored,
    )
    model = AutoModelForCausalLM.from_pretrained(tiny64_model, attn_implementation="eager")
    ordered = AnchorLogps(trainer).compute(model, sort_by_length=False)
    assert calls == [[0, 1, 2], [3, 4, 5], [6]]
    calls.clear()
    table = AnchorLogps(trainer).compute(model)
    assert calls == [[3, 6, 1], [5, 2, 4], [0]]
    real = torch.tensor([[j < len(rs) for j in range(3)] for _, rs in LENGTHS])  # (7, 3)
    assert table[real].isfinite().all()
    # float32 sums over the width 64 and a batch's tokens (3 rows of <= 40 tokens)
    assert_float_close(table[real], ordered[real], n_terms=64 * 3 * 40)
