"""A sampled response that runs on into a user turn of its own (issue 50's last weak case): the
header that opens a user turn under real chat templates, the cut on sampled ids, and the real
`axolotl preprocess` cutting, counting and saying it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pofe.demo.stages import prepare
from pofe.demo.tiny import build_tokenizer
from pofe_candidates.user_turn import UserTurn, cut_at_user_turn, user_turn
from tests.candidates._real_tokenizers import build
from tests.helpers import ROOT, run_axolotl, writes_a_user_turn

# what each template writes before a user's content, after an assistant's turn, as read off the
# templates in _real_tokenizers.py and pofe.demo.tiny (Mistral v0.1's "[INST]" is plain text;
# v0.3's is a control token)
HEADERS = {
    "qwen": UserTurn("<|im_start|>user", special=True),
    "llama3": UserTurn("<|start_header_id|>user<|end_header_id|>", special=True),
    "mistral": UserTurn("[INST]", special=False),
    "mistral_v3": UserTurn("[INST]", special=True),
}


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    return {kind: build(kind) for kind in HEADERS}


def test_the_header_of_a_user_turn_under_real_templates(tokenizers):
    assert {kind: user_turn(tok) for kind, tok in tokenizers.items()} == HEADERS
    assert user_turn(build_tokenizer()) == UserTurn("<|user|>", special=True)


def test_the_header_is_read_between_the_turns_where_the_last_turn_renders_otherwise(tokenizers):
    """Qwen3's template (axolotl's copy) writes an empty `<think>` block into the last assistant
    turn only, so a conversation with a user turn after the assistant's does not begin with the
    shorter one; the header is still `<|im_start|>user` (before: none found, nothing cut)."""
    from axolotl.utils.chat_templates import get_chat_template

    tok = build("qwen")
    tok.chat_template = get_chat_template("qwen3")
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert "<think>" in tok.apply_chat_template(turns, tokenize=False)
    assert user_turn(tok) == HEADERS["qwen"]


@pytest.mark.parametrize("kind", list(HEADERS))
def test_sampled_ids_are_cut_before_the_user_turn(tokenizers, kind):
    """The ids a model samples for an answer, then a user turn with its question (the two tokenised
    apart, as a model samples them one after the other): the cut keeps the answer's ids exactly, and
    its text is their decoding without special tokens, as the backends decode."""
    tok = tokenizers[kind]
    answer = tok("The answer is 4.", add_special_tokens=False)["input_ids"]
    turn = tok(f"{HEADERS[kind].header}\nWhat is 3+3?", add_special_tokens=False)["input_ids"]
    ids = answer + turn
    text = tok.decode(ids, skip_special_tokens=True)
    assert cut_at_user_turn(text, ids, user_turn(tok), tok) == (tok.decode(answer, skip_special_tokens=True), answer)
    # the answer alone is left as it is
    assert cut_at_user_turn(tok.decode(answer), answer, user_turn(tok), tok) is None


def test_special_headers_are_found_in_ids_whose_text_lost_them(tokenizers):
    """ChatML's `<|im_start|>` is a special token: the backends' text reads "4.user\\nHi" without it,
    so the ids decide; with no ids the text alone is searched (and holds no header here)."""
    tok = tokenizers["qwen"]
    ids = tok("4.<|im_start|>user\nHi", add_special_tokens=False)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == "4.user\nHi"
    assert cut_at_user_turn(text, ids, user_turn(tok), tok) == ("4.", ids[:2])
    assert cut_at_user_turn(text, None, user_turn(tok), tok) is None


def test_a_plain_text_header_is_cut_only_where_it_starts_a_word():
    """Mistral v0.1's "[INST]" is text: cut at the response's start or after whitespace (where the
    template writes it), not inside a word."""
    turn = HEADERS["mistral"]
    assert cut_at_user_turn("4 [INST] and 3+3?", None, turn, None) == ("4 ", None)
    assert cut_at_user_turn("[INST] 3+3?", None, turn, None) == ("", None)
    assert cut_at_user_turn("x[INST] stays", None, turn, None) is None


def test_no_template_no_header():
    tok = build_tokenizer()
    tok.chat_template = None
    assert user_turn(tok) is None


@pytest.mark.e2e
def test_preprocess_cuts_samples_that_write_a_user_turn_and_says_how_many(tmp_path):
    """The demo's offline RRHF recipe from a policy that answers every prompt "42" and then writes a
    user turn of its own ("<|user|>?") before its end of turn (`writes_a_user_turn`). 60 prompts x 4
    samples: all 240 are cut before "<|user|>", so each prompt's sampled candidate is "42" on the ids
    of "4" and "2" (duplicates of one another). Before, the candidates read "42?" (the backend's
    text drops the special `<|user|>`) and trained on the user turn's ids, and nothing said so."""
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny-rrhf-cpu.yml").read_text())
    for key in ("base_model", "output_dir", "dataset_prepared_path"):
        recipe[key] = str(tmp_path / recipe[key])
    recipe["datasets"][0]["path"] = str(tmp_path / recipe["datasets"][0]["path"])
    recipe["pofe"]["generate"]["max_new_tokens"] = 8
    rows = prepare(recipe, seed=0)
    writes_a_user_turn(Path(recipe["base_model"]))
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(recipe))

    proc = run_axolotl("preprocess", str(path), cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert "samples cut where they began a user turn 240," in said, said[-3000:]
    summary_path = Path(re.search(r"summary in (\S+summary\.json)", said).group(1))
    assert json.loads(summary_path.read_text())["candidates_cut_at_user_turn"] == 240
    tok = build_tokenizer()
    four_two = tok("42", add_special_tokens=False)["input_ids"]
    data = [json.loads(line) for line in (summary_path.parent / "data.jsonl").read_text().splitlines()]
    assert len(data) == len(rows) == 60
    for row in data:
        assert not any("?" in r for r in row["responses"])
        # where "42" is also a dataset response (the sum or a near miss) the sample is its duplicate,
        # removed, and the row has no sampled ids; else the sample is a candidate of its own
        ids = row.get("response_ids") or [None] * len(row["responses"])
        sampled = [i for i in ids if i is not None]
        assert sampled in ([four_two], []) and "42" in row["responses"]
