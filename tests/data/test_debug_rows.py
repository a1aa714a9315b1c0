"""`axolotl preprocess --debug` shows POFE rows as axolotl shows its own (issue 34): before,
the plugin's dataset hook returned and axolotl's own row check never ran, so `--debug` showed
nothing and checking a chat template meant decoding `prompt_ids` by hand."""

from __future__ import annotations

import json
import re

import pytest

from pofe.data.debug_rows import debug_request, show_rows


def test_the_debug_flags_are_read_from_the_raw_config():
    """axolotl's CLI puts them in the raw config (its schema drops them before any hook that
    sees the validated one): `--debug` alone shows one row, as axolotl's preprocess does."""
    assert debug_request({}) == (0, False)
    assert debug_request({"debug": False, "debug_num_examples": 0}) == (0, False)
    assert debug_request({"debug": True}) == (1, False)
    assert debug_request({"debug": True, "debug_num_examples": 3}) == (3, False)
    assert debug_request({"debug_text_only": True}) == (1, True)


def test_each_candidate_is_shown_with_its_prompt_masked_and_its_tokens_trained(tokenizer):
    """Row: prompt "1+1=" rendered `<|user|>1+1=<|end|><|assistant|>` (7 tokens: the role markers
    and end are one token each, every other character one), candidates "2" and "3" (each with
    the end of turn: 2 tokens). Each candidate's line is axolotl's: every token with
    (label, id), the prompt's labels -100, the candidate's their own ids."""
    from datasets import Dataset

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "1+1="}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answers = [
        tokenizer("2<|end|>", add_special_tokens=False)["input_ids"],
        tokenizer("3<|end|>", add_special_tokens=False)["input_ids"],
    ]
    assert len(prompt_ids) == 7 and [len(a) for a in answers] == [2, 2]
    rows = Dataset.from_list([{"prompt_ids": prompt_ids, "response_ids": answers, "rewards": [1.0, 0.25]}] * 3)
    lines = show_rows(rows, tokenizer, "rrhf", count=2)
    assert len(lines) == 4  # 2 rows x 2 candidates
    for line, ids in zip(lines[:2], answers):
        for t in prompt_ids:
            assert f"(-100, {t})" in line
        for t in ids:
            assert f"({t}, {t})" in line
    text_only = show_rows(rows, tokenizer, "rrhf", count=1, text_only=True)
    assert "(-100" not in text_only[0] and "<|assistant|> 2 <|end|>" in text_only[0]


@pytest.mark.e2e
def test_axolotl_preprocess_debug_prints_pofe_rows(tmp_path, tiny_model):
    """TRL's implicit text pairs (issue 44): the split of the first rows is shown, a split inside a
    number marked, and each row trained as text: prompt "16+11=2" is 7 tokens (one a character),
    candidate "7" and eos_token 2."""
    from tests.data.test_text_rows import TEXT_PAIRS
    from tests.helpers import recipe, run_axolotl

    rows = TEXT_PAIRS
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = recipe(tmp_path, tiny_model, "sppo", data, "pofe.pairs", pofe={"eta": 10.0})
    proc = run_axolotl("preprocess", str(cfg), "--debug", "--debug-num-examples", "2")
    out = proc.stdout + proc.stderr
    # the prepared rows come shuffled (axolotl's merge): a prompt of 7 ("16+11=2") or 5 ("2+11=") tokens
    assert re.search(r"POFE row 0: prompt [57] tokens \(not trained\), 2 candidates; win rates: \[1.0, 0.0\]", out)
    assert "POFE row 1:" in out and "POFE row 2:" not in out
    assert "candidate 1 (win rate 0), 2 trained tokens:" in out
    assert "(-100," in out
    assert "implicit prompt (the responses' shared start) '16+11=2' ENDS INSIDE A WORD OR NUMBER" in out
    assert "2 of 4 rows of" in out and "part inside a word or number (rows 0, 1)" in out
