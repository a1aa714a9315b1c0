"""Chat-template rendering, the length policy and the B x k collator layout."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from pofe.collator import KResponseCollator
from pofe.columns import IGNORE_INDEX
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


def test_truncate_cuts_whole_turns_then_responses_without_end_of_turn(tok):
    """char-level tokens. Prompt: <|system|>s<|end|> (3) + 3 turns <|user|>x*20<|end|> (22 each,
    the middle one an assistant's) + <|assistant|> (1) = 70 > max_prompt_len 30, so the two oldest
    non-system turns go: 3 + 22 + 1 = 26. Room 40 - 26 = 14: "a"*20 + <|end|> (21) keeps 14 content
    ids and loses <|end|>; "abc<|end|>" (4) is whole."""
    turns = [{"role": "system", "content": "s"}] + [
        {"role": role, "content": c * 20} for role, c in (("user", "x"), ("assistant", "y"), ("user", "z"))
    ]
    long = {**row(responses=("a" * 20, "abc")), "prompt": turns}
    out = tokenize_row(long, tok, sequence_len=40, max_prompt_len=30, truncation="truncate")
    assert tok.decode(out["prompt_ids"]) == "<|system|>s<|end|><|user|>" + "z" * 20 + "<|end|><|assistant|>"
    assert [tok.decode(r) for r in out["response_ids"]] == ["a" * 14, "abc<|end|>"]
    assert (out["turns_cut"], out["responses_cut"], out["drop_reason"], out["keep"]) == (2, 1, None, True)


def test_truncation_never_makes_identical_candidates_or_cuts_a_turn(tok):
    """Bad case 3 of issue 20: a one-turn prompt longer than sequence_len with responses
    "2"*50+"3" and "2"*50+"4" (rewards 1, 0) became '2'*32 twice, labelled 1 and 0, after a prompt
    cut mid-text without its role token. Now a prompt whose last user turn cannot fit is dropped;
    and cut responses that collide drop their row, named by why."""
    case = row(prompt="1" * 80, responses=("2" * 50 + "3", "2" * 50 + "4"))
    out = tokenize_row(case, tok, sequence_len=64, max_prompt_len=32, truncation="truncate")
    assert (out["keep"], out["drop_reason"]) == (False, "prompt_too_long")
    # the same responses after a prompt that fits (8 ids): room 48 - 8 = 40 cuts both to '2'*40
    fits = row(prompt="1" * 5, responses=("2" * 50 + "3", "2" * 50 + "4"))
    out = tokenize_row(fits, tok, sequence_len=48, max_prompt_len=32, truncation="truncate")
    assert (out["keep"], out["drop_reason"], out["responses_cut"]) == (False, "cut_conflicting_labels", 2)
    tied = {**fits, "rewards": [0.5, 0.5]}
    out = tokenize_row(tied, tok, sequence_len=48, max_prompt_len=32, truncation="truncate")
    assert (out["keep"], out["drop_reason"]) == (False, "cut_identical")


def test_truncating_sampled_ids_drops_their_end_of_turn_and_given_anchors(tok):
    """A row with sampled ids (`response_ids`) is cut the same way: content ids first, no end of
    turn. Its given anchor log-probs were for the whole responses, so they are cleared."""
    sampled = [tok("a" * 20, add_special_tokens=False)["input_ids"], tok("b", add_special_tokens=False)["input_ids"]]
    case = {**row(responses=("a" * 20, "b")), "response_ids": sampled, "anchor_logps": [-3.0, -1.0]}
    out = tokenize_row(case, tok, sequence_len=20, max_prompt_len=10, truncation="truncate")
    # prompt "<|user|>12+7=<|end|><|assistant|>" = 8 ids; room 12
    assert [tok.decode(r) for r in out["response_ids"]] == ["a" * 12, "b<|end|>"]
    assert out["anchor_logps"] is None and out["keep"]
    whole = tokenize_row(case, tok, sequence_len=64, max_prompt_len=32, truncation="truncate")
    assert whole["anchor_logps"] == [-3.0, -1.0]


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
