"""Chat-template rendering, the length policy and the B x k collator layout."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from pofe.collator import KResponseCollator
from pofe.layout import IGNORE_INDEX
from pofe.data.tokenize import render_row, tokenize_row


@pytest.fixture(scope="module")
def tok(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def row(prompt="12+7=", responses=("19", "2")):
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "responses": [{"role": "assistant", "content": r} for r in responses],
        "rewards": [1.0, 0.0][: len(responses)] + [0.0] * (len(responses) - 2),
    }


def test_render_splits_prompt_and_assistant_turn(tok):
    prompt, responses = render_row(row(), tok)
    assert prompt == "<|user|>12+7=<|end|><|assistant|>"
    # the end-of-turn token belongs to the response: the model learns to stop
    assert responses == ["19<|end|>", "2<|end|>"]


def test_tokenize_ids_match_the_rendered_text(tok):
    out = tokenize_row(row(), tok, sequence_len=64, max_prompt_len=32, truncation="truncate")
    assert tok.decode(out["prompt_ids"]) == "<|user|>12+7=<|end|><|assistant|>"
    assert [tok.decode(r) for r in out["response_ids"]] == ["19<|end|>", "2<|end|>"]
    assert (out["truncated"], out["keep"], out["rewards"]) == (False, True, [1.0, 0.0])


def test_truncate_keeps_prompt_end_then_cuts_responses(tok):
    # char-level tokens: prompt <|user|> + 40 x + <|end|> + <|assistant|> = 43; responses 11, 4
    long = row(prompt="x" * 40, responses=("abcdefghij", "abc"))
    out = tokenize_row(long, tok, sequence_len=24, max_prompt_len=16, truncation="truncate")
    assert len(out["prompt_ids"]) == 16
    assert tok.decode(out["prompt_ids"]).endswith("x<|end|><|assistant|>")
    assert [len(r) for r in out["response_ids"]] == [8, 4]  # room = 24 - 16
    assert out["truncated"] and out["keep"]


def test_drop_marks_the_row(tok):
    long = row(prompt="x" * 40)
    out = tokenize_row(long, tok, sequence_len=24, max_prompt_len=16, truncation="drop")
    assert out["truncated"] and not out["keep"]
    short = tokenize_row(row(), tok, sequence_len=24, max_prompt_len=16, truncation="drop")
    assert short["keep"]


def test_collator_layout_varying_k():
    class Tok:
        pad_token_id = 0
        eos_token_id = 9

    features = [
        {"prompt_ids": [5, 6], "response_ids": [[7], [8, 8, 8]], "rewards": [1.0, 0.5]},
        {"prompt_ids": [4], "response_ids": [[3, 3], [2], [1, 1]], "rewards": [0.1, 0.9, 0.3]},
    ]
    batch = KResponseCollator(Tok(), pad_to_multiple_of=8)(features)
    I = IGNORE_INDEX
    assert batch["input_ids"].tolist() == [
        [5, 6, 7, 0, 0, 0, 0, 0],
        [5, 6, 8, 8, 8, 0, 0, 0],
        [4, 3, 3, 0, 0, 0, 0, 0],
        [4, 2, 0, 0, 0, 0, 0, 0],
        [4, 1, 1, 0, 0, 0, 0, 0],
    ]
    assert batch["labels"].tolist() == [
        [I, I, 7, I, I, I, I, I],
        [I, I, 8, 8, 8, I, I, I],
        [I, 3, 3, I, I, I, I, I],
        [I, 2, I, I, I, I, I, I],
        [I, 1, 1, I, I, I, I, I],
    ]
    assert batch["attention_mask"].sum(1).tolist() == [3, 5, 3, 2, 3]
    assert batch["candidate_mask"].tolist() == [[True, True, False], [True, True, True]]
    assert torch.allclose(batch["rewards"], torch.tensor([[1.0, 0.5, 0.0], [0.1, 0.9, 0.3]]))
    # flat rows go back to (B, K) in row-major order of the mask
    flat = torch.arange(5.0)
    back = flat.new_zeros(2, 3).masked_scatter(batch["candidate_mask"], flat)
    assert back.tolist() == [[0.0, 1.0, 0.0], [2.0, 3.0, 4.0]]
