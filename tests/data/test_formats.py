"""Row checks: every bad input names the dataset, the row, the field and the fix."""

from __future__ import annotations

import json
import math

import pytest

from pofe.data.formats import PofeDataError, RowFormat, check_columns, normalize_row, prompt_row

RRHF = RowFormat(dataset="data/c.jsonl", type="pofe.rrhf", method="rrhf", fields={})
SPPO = RowFormat(dataset="data/s.jsonl", type="pofe.sppo", method="sppo", fields={})


def good_rrhf(**kw):
    return {"prompt": "2+2=", "responses": ["4", "5", "3"], "rewards": [1.0, 0.2, 0.3], **kw}


def test_rrhf_row_canonical_form():
    row = normalize_row(good_rrhf(), 0, RRHF)
    assert row == {
        "prompt": [{"role": "user", "content": "2+2="}],
        "responses": [{"role": "assistant", "content": t} for t in ("4", "5", "3")],
        "rewards": [1.0, 0.2, 0.3],
        "source_prompt": "2+2=",  # as a judge reads it: evaluation's held-out prompts
        "as_text": False,  # POFE's own k-response rows: a text prompt is a user turn
        "split_in_word": False,
    }


def test_chat_messages_and_ranks_and_custom_columns():
    fmt = RowFormat(
        dataset="d",
        type="pofe.rrhf",
        method="rrhf",
        fields={"field_prompt": "q", "field_responses": "answers", "field_ranks": "rank"},
    )
    raw = {
        "q": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "answers": [{"role": "assistant", "content": "hello"}, "yo"],
        "rank": [2, 1],
    }
    row = normalize_row(raw, 0, fmt)
    assert row["prompt"][0] == {"role": "system", "content": "be brief"}
    assert row["responses"][1] == {"role": "assistant", "content": "yo"}
    # rank 1 is best, so it must carry the higher reward
    assert row["rewards"] == [-2.0, -1.0]


def test_pairs_map_to_rewards_and_win_rates():
    raw = {"prompt": "p", "chosen": "a", "rejected": "b"}
    pairs_rrhf = RowFormat(dataset="d", type="pofe.pairs", method="rrhf", fields={})
    pairs_sppo = RowFormat(dataset="d", type="pofe.pairs", method="sppo", fields={})
    assert normalize_row(raw, 0, pairs_rrhf)["rewards"] == [1.0, 0.0]
    assert normalize_row(raw, 0, pairs_sppo)["win_rates"] == [1.0, 0.0]


def test_sppo_authors_layout():
    fmt = RowFormat(dataset="UCLA-AGI/x", type="pofe.sppo_ucla", method="sppo", fields={})
    raw = {
        "prompt": "p",
        "chosen": "a",
        "rejected": "b",
        "chosen_probs": 0.7,
        "chosen_probs_win": 0.62,
        "chosen_probs_lose": 0.41,
    }
    row = normalize_row(raw, 0, fmt)
    assert row["win_rates"] == [0.62, 0.41]
    assert row["anchor_logps"] is None


def test_sppo_anchor_column_used_as_given():
    row = normalize_row(
        {"prompt": "p", "responses": ["a", "b"], "win_rates": [0.7, 0.3], "anchor_logps": [-3.5, -7.25]}, 0, SPPO
    )
    assert row["anchor_logps"] == [-3.5, -7.25]


BAD_RRHF = [
    (good_rrhf(rewards=[1.0, 0.2]), "field 'rewards': 2 values for 3 responses"),
    (good_rrhf(responses=["4"], rewards=[1.0]), "field 'responses': k = 1 response(s)"),
    (good_rrhf(rewards=[1.0, "high", 0.3]), "field 'rewards[1]': expected a number, got 'high'"),
    (good_rrhf(rewards=[1.0, math.nan, 0.3]), "field 'rewards[1]': nan is not finite"),
    (good_rrhf(rewards=[1.0, 0.2, math.inf]), "field 'rewards[2]': inf is not finite"),
    (good_rrhf(responses=["4", "  ", "3"]), "field 'responses[1]': the response is empty"),
    (good_rrhf(prompt=""), "field 'prompt': the prompt is empty"),
    (good_rrhf(responses="4"), "field 'responses': expected a list of responses, got str"),
    (good_rrhf(rewards=None), "field 'ranks': expected a list of 3 numbers, got None"),
]


@pytest.mark.parametrize("raw,message", BAD_RRHF)
def test_bad_rrhf_rows_name_dataset_row_field(raw, message):
    with pytest.raises(PofeDataError) as err:
        normalize_row(raw, 7, RRHF)
    text = str(err.value)
    assert text.startswith("dataset data/c.jsonl, row 7 (0-based), ")
    assert message in text


@pytest.mark.parametrize(
    "win_rates,message",
    [
        ([0.5, 1.2], "field 'win_rates[1]': win rate 1.2 is outside [0, 1]"),
        ([-0.1, 0.5], "field 'win_rates[0]': win rate -0.1 is outside [0, 1]"),
        ([0.5], "field 'win_rates': 1 values for 2 responses"),
    ],
)
def test_bad_win_rates(win_rates, message):
    with pytest.raises(PofeDataError, match="dataset data/s.jsonl, row 3") as err:
        normalize_row({"prompt": "p", "responses": ["a", "b"], "win_rates": win_rates}, 3, SPPO)
    assert message in str(err.value)


def test_missing_column_is_named_with_the_fix():
    with pytest.raises(PofeDataError) as err:
        check_columns(RRHF, ["prompt", "answers", "rewards"])
    assert "dataset data/c.jsonl: missing column(s) ['responses']" in str(err.value)
    assert "field_" in str(err.value)
    with pytest.raises(PofeDataError, match=r"rewards \(or ranks\)"):
        check_columns(RRHF, ["prompt", "responses"])
    check_columns(RRHF, ["prompt", "responses", "ranks"])  # ranks alone suffice


def test_bad_row_fails_axolotl_preprocess_with_the_row(tmp_path, tiny_model):
    """The same message reaches a user running the CLI, for row 2 of a JSONL file."""
    from tests.helpers import recipe, run_axolotl

    rows = [good_rrhf(), good_rrhf(), good_rrhf(rewards=[1.0, None, 0.0])]
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf")
    proc = run_axolotl("preprocess", str(cfg), check=False)
    assert proc.returncode != 0
    assert f"dataset {data}, row 2 (0-based), field 'rewards[1]': expected a number, got None" in proc.stderr


def test_conversational_responses_take_the_final_assistant_turn():
    fmt = RowFormat(dataset="d", type="pofe.pairs", method="rrhf", fields={})

    def conv(text):
        return [{"role": "user", "content": "p"}, {"role": "assistant", "content": text}]

    row = normalize_row({"prompt": "p", "chosen": conv("good"), "rejected": conv("bad")}, 0, fmt)
    assert [m["content"] for m in row["responses"]] == ["good", "bad"]
    with pytest.raises(PofeDataError) as refused:
        normalize_row({"prompt": "p", "chosen": conv("a"), "rejected": conv("b")[:1]}, 0, fmt)
    assert str(refused.value) == (
        "dataset d, row 0 (0-based), field 'rejected': the conversation ends with a 'user' turn, not the "
        "assistant's reply. End each response conversation with the assistant turn being ranked, or give the "
        "reply alone (its text, or {role: assistant, content: ...})."
    )


def test_a_response_conversation_ending_in_a_user_turn_is_named_with_its_own_fix():
    """k responses, the second a conversation whose last turn is the user's: the error says so, with
    the fix for it (it said "Remove the empty candidate or regenerate it", the fix of an empty one)."""
    turns = [
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "?"},
    ]
    with pytest.raises(PofeDataError) as refused:
        normalize_row(good_rrhf(responses=["4", turns, "3"]), 5, RRHF)
    assert str(refused.value) == (
        "dataset data/c.jsonl, row 5 (0-based), field 'responses[1]': the conversation ends with a 'user' turn, not "
        "the assistant's reply. End each response conversation with the assistant turn being ranked, or give the "
        "reply alone (its text, or {role: assistant, content: ...})."
    )
    with pytest.raises(PofeDataError, match=r"field 'responses\[1\]': the response is empty\. Remove the empty"):
        normalize_row(good_rrhf(responses=["4", " ", "3"]), 5, RRHF)


def test_rewards_and_ranks_that_disagree_are_refused_naming_the_pair():
    """Row 3 gives rewards [1.0, 0.2, 0.3] and ranks [3, 2, 1] (1 = best): the ranks put response 1
    above response 0 (rank 2 < 3), the rewards below it (0.2 < 1.0), the first such pair named.
    Ranks that agree with the rewards, or tie where the rewards do not, pass; the rewards are
    trained on."""
    with pytest.raises(PofeDataError) as refused:
        normalize_row(good_rrhf(ranks=[3, 2, 1]), 3, RRHF)
    assert str(refused.value) == (
        "dataset data/c.jsonl, row 3 (0-based), field 'rewards and ranks': they disagree: ranks[1] = 2 ranks "
        "response 1 above response 0 (ranks[0] = 3), rewards[1] = 0.2 scores it below (rewards[0] = 1). POFE "
        "trains on rewards when a row has both, so ranks would be ignored: fix the row, or keep one of the two "
        "columns (drop ranks, or drop rewards to train on the ranks)."
    )
    assert normalize_row(good_rrhf(ranks=[1, 3, 2]), 3, RRHF)["rewards"] == [1.0, 0.2, 0.3]
    assert normalize_row(good_rrhf(ranks=[1, 2, 2]), 3, RRHF)["rewards"] == [1.0, 0.2, 0.3]


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]

BAD_CONTENT = [
    (
        good_rrhf(prompt=[{"role": "user", "content": None}]),
        "field 'prompt[0].content': expected text, got None. Give every message its text",
    ),
    (good_rrhf(prompt=[CHAT[0], {"role": "user", "content": " "}]), "field 'prompt[1].content': the message is empty"),
    (
        good_rrhf(prompt=CHAT + [{"role": "assistant", "content": "4"}]),
        "field 'prompt[2]': the prompt ends with an assistant turn. End the prompt with",
    ),
    (
        good_rrhf(responses=["4", {"role": "assistant", "content": None}, "3"]),
        "field 'responses[1]': expected text or an assistant message, got NoneType",
    ),
    (
        good_rrhf(responses=["4", {"role": "assistant", "content": ""}, "3"]),
        "field 'responses[1]': the response is empty",
    ),
]


@pytest.mark.parametrize("raw,message", BAD_CONTENT)
def test_none_or_empty_content_and_trailing_assistant_turn(raw, message):
    """`content: None` used to become the text "None"; a prompt ending in the assistant's
    turn rendered two assistant turns in a row."""
    with pytest.raises(PofeDataError) as err:
        normalize_row(raw, 4, RRHF)
    assert str(err.value).startswith("dataset data/c.jsonl, row 4 (0-based), ")
    assert message in str(err.value)


def test_duplicate_responses_with_conflicting_labels():
    with pytest.raises(PofeDataError) as err:
        normalize_row(good_rrhf(responses=["4", "5", "4"], rewards=[1.0, 0.2, 0.0]), 1, RRHF)
    assert (
        "row 1 (0-based), field 'responses[2]': the same text as responses[0] but "
        "rewards 0.0 vs 1.0. Remove the duplicate"
    ) in str(err.value)
    with pytest.raises(
        PofeDataError,
        match=r"field 'responses\[1\]': the same text as "
        r"responses\[0\] but win rates 0.3 vs 0.7",
    ):
        normalize_row({"prompt": "p", "responses": ["a", "a"], "win_rates": [0.7, 0.3]}, 0, SPPO)
    pairs = RowFormat(dataset="d", type="pofe.pairs", method="rrhf", fields={})
    with pytest.raises(PofeDataError, match="field 'rejected': the same text as chosen"):
        normalize_row({"prompt": "p", "chosen": "a", "rejected": "a"}, 0, pairs)
    # duplicates that agree are not a contradiction
    row = normalize_row(good_rrhf(responses=["4", "5", "4"], rewards=[1.0, 0.2, 1.0]), 0, RRHF)
    assert row["rewards"] == [1.0, 0.2, 1.0]


def test_labels_checked_in_float32():
    """1e39 is finite in float64 but inf in float32; 1e8 + 1 and 1e8 are one float32."""
    with pytest.raises(PofeDataError, match=r"field 'rewards\[1\]': 1e\+39 overflows float32"):
        normalize_row(good_rrhf(rewards=[1.0, 1e39, 0.3]), 0, RRHF)
    with pytest.raises(PofeDataError, match=r"field 'anchor_logps\[0\]': -1e\+39 overflows"):
        normalize_row(
            {"prompt": "p", "responses": ["a", "b"], "win_rates": [0.7, 0.3], "anchor_logps": [-1e39, -2.0]}, 0, SPPO
        )
    for bad in (math.nan, -math.inf):  # bad case 5 of issue 20: refused already when rows are read
        with pytest.raises(PofeDataError, match=rf"row 0.*field 'anchor_logps\[1\]': {bad} is not finite"):
            normalize_row(
                {"prompt": "p", "responses": ["a", "b"], "win_rates": [0.7, 0.3], "anchor_logps": [-1.0, bad]}, 0, SPPO
            )
    with pytest.raises(PofeDataError) as err:
        normalize_row(good_rrhf(rewards=[1e8 + 1, 1e8, 0.0]), 0, RRHF)
    assert (
        "field 'responses[1]': reward 100000000.0 differs from responses[0]'s "
        "100000001.0 but both are 100000000.0 in float32"
    ) in str(err.value)
    # float64 rounding noise is not a ranking: 0.1 + 0.2 and 0.3 tie, as meant
    assert normalize_row(good_rrhf(rewards=[0.1 + 0.2, 0.3, 0.0]), 0, RRHF)["rewards"][1] == 0.3


def test_rows_with_all_equal_rewards_are_counted_and_warned(caplog):
    """Equal rewards form no RRHF pair: the row only fine-tunes on responses[0]."""
    from pofe.data.loader import LOG, _warn_equal_labels
    from pofe.methods import RRHF

    # axolotl's logging config does not propagate its loggers to the root, where caplog listens
    LOG.logger.addHandler(caplog.handler)
    try:
        assert _warn_equal_labels([[1.0, 1.0], [1.0, 0.0], [0.5, 0.5, 0.5]], "d.jsonl", RRHF) == 2
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert (
        "2 of 3 rows of d.jsonl have all-equal rewards; RRHF learns no ranking from them, only SFT "
        "on their first response"
    ) in caplog.text
    assert _warn_equal_labels([[1.0, 0.0]], "d.jsonl", RRHF) == 0


def test_jsonl_mixing_strings_and_messages_reads_back_as_written(tmp_path):
    """`datasets` reads such a column as JSON and keeps strings that parse as JSON
    unencoded: "32" came back as the int 32 and the valid row was rejected."""
    from axolotl.utils.dict import DictDefault

    from pofe.data.sources import load_entry

    rows = [
        {"prompt": "2+2=", "responses": ["4", "5"], "rewards": [1.0, 0.0]},
        {
            "prompt": [{"role": "user", "content": "8*4="}],
            "responses": ["32", {"role": "assistant", "content": "null"}],
            "rewards": [1.0, 0.0],
        },
    ]
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    raw = load_entry(DictDefault(path=str(data), type="pofe.rrhf"), False)
    assert list(raw) == rows
    assert normalize_row(list(raw)[1], 1, RRHF)["responses"] == [
        {"role": "assistant", "content": "32"},
        {"role": "assistant", "content": "null"},
    ]
    assert list(load_entry(DictDefault(path=str(data), split="train[1:]"), False)) == rows[1:]


def test_malformed_jsonl_names_the_file_and_line(tmp_path):
    from pofe.data.sources import read_json_rows

    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps(good_rrhf()) + '\n{"prompt": "b", "responses": ["x",\n')
    with pytest.raises(PofeDataError, match=f"dataset {data}, line 2: not valid JSON"):
        read_json_rows(data)
    data.write_text(json.dumps(good_rrhf()) + '\n["not", "an object"]\n')
    with pytest.raises(PofeDataError, match=f"dataset {data}, line 2: expected a JSON object, got list"):
        read_json_rows(data)
    data.write_text("")
    with pytest.raises(PofeDataError, match="the file has no rows"):
        read_json_rows(data)
    data.write_text(json.dumps([good_rrhf(), good_rrhf()], indent=1))  # one JSON list
    assert len(read_json_rows(data)) == 2


def test_invalid_unicode_in_jsonl_names_the_file_and_line(tmp_path):
    """Bad case 6 of issue 20: a lone surrogate ("\\ud800", valid JSON, not Unicode) or bytes
    that are not UTF-8 are named with the file, line and field; a surrogate pair is fine."""
    from pofe.data.sources import read_json_rows

    data = tmp_path / "bad.jsonl"
    emoji = good_rrhf(responses=["ok \U0001f600", "b", "c"])
    data.write_text(json.dumps(good_rrhf()) + "\n" + json.dumps(emoji) + "\n")  # ensure_ascii: \ud83d\ude00
    assert read_json_rows(data)[1]["responses"][0] == "ok \U0001f600"
    data.write_text(json.dumps(good_rrhf()) + "\n" + json.dumps(good_rrhf(responses=["a", "half \ud800", "c"])) + "\n")
    with pytest.raises(
        PofeDataError, match=rf"dataset {data}, line 2, field 'responses\[1\]': surrogates not allowed"
    ):
        read_json_rows(data)
    data.write_text(json.dumps([good_rrhf(responses=["\udfff", "b", "c"])]))
    with pytest.raises(PofeDataError, match=r"row 0 \(0-based\), field 'responses\[0\]'"):
        read_json_rows(data)
    data.write_bytes(json.dumps(good_rrhf()).encode() + b'\n{"prompt": "caf\xe9"}\n')  # latin-1
    with pytest.raises(PofeDataError, match=rf"dataset {data}, line 2: byte b'\\xe9' at offset \d+ is not UTF-8"):
        read_json_rows(data)


def _ucla_row(prompt="What is 2+2?", chosen="4", rejected="5"):
    """One row as uclaml/SPPO's scripts/compute_prob.py (prepare_score) writes it: no prompt
    column; chosen and rejected are [user, assistant] conversations. K = 5 with rank scores
    s = (1, 0, 0, 0, -1): P[i][j] = 1 / (1 + exp(s_j - s_i)); chosen = argmax s, rejected = argmin
    s; chosen_probs = P[0][4]; chosen_probs_win / _lose = mean of row 0 / row 4 of P."""
    s = [1.0, 0.0, 0.0, 0.0, -1.0]
    p = [[1 / (1 + math.exp(sj - si)) for sj in s] for si in s]
    return {
        "chosen": [{"content": prompt, "role": "user"}, {"content": chosen, "role": "assistant"}],
        "rejected": [{"content": prompt, "role": "user"}, {"content": rejected, "role": "assistant"}],
        "chosen_probs": p[0][4],
        "chosen_probs_win": sum(p[0]) / 5,
        "chosen_probs_lose": sum(p[4]) / 5,
    }


def test_sppo_authors_scored_parquet_without_a_prompt_column(tmp_path):
    """Read back from parquet as the scripts write it (pandas, index=False): the prompt is the
    conversations' user turn; win rates are chosen_probs_win / _lose (0.5 + 3 x 0.731 + 0.881) / 5
    and (0.119 + 3 x 0.269 + 0.5) / 5."""
    import pandas as pd
    from datasets import Dataset

    pd.DataFrame([_ucla_row()]).to_parquet(tmp_path / "train.parquet", index=False)
    data = Dataset.from_parquet(str(tmp_path / "train.parquet"))
    fmt = RowFormat(dataset="UCLA-AGI/x", type="pofe.sppo_ucla", method="sppo", fields={})
    check_columns(fmt, data.column_names)  # no prompt column: not required
    row = normalize_row(data[0], 0, fmt)
    assert row["prompt"] == [{"role": "user", "content": "What is 2+2?"}]
    assert row["responses"] == [{"role": "assistant", "content": "4"}, {"role": "assistant", "content": "5"}]
    sig = 1 / (1 + math.exp(-1))
    assert row["win_rates"] == pytest.approx(
        [(0.5 + 3 * sig + 1 / (1 + math.exp(-2))) / 5, (1 / (1 + math.exp(2)) + 3 * (1 - sig) + 0.5) / 5], abs=1e-12
    )


def test_sppo_authors_rows_whose_conversations_disagree_or_are_not_conversations():
    fmt = RowFormat(dataset="UCLA-AGI/x", type="pofe.sppo_ucla", method="sppo", fields={})
    row = _ucla_row()
    row["rejected"][0]["content"] = "What is 3+3?"
    with pytest.raises(PofeDataError, match=r"row 0 .*'rejected': shares no leading turn with chosen, so there is no"):
        normalize_row(row, 0, fmt)
    row = {**_ucla_row(), "chosen": "4"}
    with pytest.raises(PofeDataError, match=r"'rejected': is a conversation where chosen is text"):
        normalize_row(row, 0, fmt)
    row = {**_ucla_row(), "chosen": 4}
    with pytest.raises(PofeDataError, match=r"'chosen': no prompt column, and this is neither a conversation nor"):
        normalize_row(row, 0, fmt)


def test_an_unknown_role_is_refused_naming_the_message():
    # a chat template renders "usr" as written: the row would train on a role no model knows
    prompt = [{"role": "system", "content": "be brief"}, {"role": "usr", "content": "hi"}]
    with pytest.raises(PofeDataError) as err:
        normalize_row(good_rrhf(prompt=prompt), 3, RRHF)
    assert (
        "dataset data/c.jsonl, row 3 (0-based), field 'prompt[1].role': unknown role 'usr'. Use one of "
        "['system', 'user', 'assistant', 'tool']"
    ) in str(err.value)


def test_prompts_entry_refuses_an_unknown_role_before_generation():
    """A `pofe.prompts` row reached the generator unchecked: role `usr` was rendered as written
    and sampled from, and refused only when training read the candidates' rows."""
    fmt = RowFormat(dataset="data/p.jsonl", type="pofe.prompts", method="rrhf", fields={"field_prompt": "question"})
    good = {"question": [{"role": "user", "content": "hi"}], "id": 7}
    assert prompt_row(good, 0, fmt, []) == good
    with pytest.raises(PofeDataError) as err:
        prompt_row({"question": [{"role": "usr", "content": "hi"}]}, 2, fmt, [])
    assert "dataset data/p.jsonl, row 2 (0-based), field 'question[0].role': unknown role 'usr'" in str(err.value)


def test_a_tool_call_response_says_what_it_is():
    tool_call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}]}
    with pytest.raises(
        PofeDataError,
        match=r"row 0 \(0-based\), field 'responses\[1\]': the response is a tool "
        r"call \(tool_calls\) with no text; .*does not support tool calls as a response",
    ):
        normalize_row(good_rrhf(responses=["4", tool_call, "3"]), 0, RRHF)
    # text beside a tool call is a text response, trained on as such
    with_text = dict(tool_call, content="let me add")
    assert (
        normalize_row(good_rrhf(responses=["4", with_text, "3"]), 0, RRHF)["responses"][1]["content"] == "let me add"
    )


def test_negative_ranks_and_positive_anchor_log_probs_are_refused():
    with pytest.raises(
        PofeDataError, match=r"row 2 \(0-based\), field 'ranks\[1\]': rank -3 is negative.*field_rewards"
    ):
        normalize_row({"prompt": "p", "responses": ["a", "b"], "ranks": [1, -3]}, 2, RRHF)
    assert normalize_row({"prompt": "p", "responses": ["a", "b"], "ranks": [0, 1]}, 2, RRHF)["rewards"] == [0.0, -1.0]
    with pytest.raises(PofeDataError, match=r"field 'anchor_logps\[1\]': log-prob 0.5 is positive"):
        normalize_row(
            {"prompt": "p", "responses": ["a", "b"], "win_rates": [0.6, 0.4], "anchor_logps": [-3.5, 0.5]}, 0, SPPO
        )
    # 0 (probability 1) and float32 rounding just above it pass
    row = normalize_row(
        {"prompt": "p", "responses": ["a", "b"], "win_rates": [0.6, 0.4], "anchor_logps": [0.0, 1e-6]}, 0, SPPO
    )
    assert row["anchor_logps"] == [0.0, 1e-6]


def test_rows_with_opposite_labels_or_a_reversed_ucla_pair_are_counted_and_warned(caplog):
    """Row 2 repeats row 0's prompt with the order of "4" and "5" reversed; row 3 repeats it in the
    same order (no conflict); row 1 has another prompt. In the UCLA layout, row 1's chosen has the
    lower win rate."""
    from datasets import Dataset

    from pofe.data.label_checks import text_keys
    from pofe.data.loader import LOG, _warn_suspicious_labels

    rows = [
        good_rrhf(),
        good_rrhf(prompt="3+3="),
        good_rrhf(rewards=[0.2, 1.0, 0.3]),
        good_rrhf(rewards=[5.0, 1.0, 2.0]),
    ]
    canonical = [normalize_row(r, n, RRHF) for n, r in enumerate(rows)]
    part = Dataset.from_list([{**text_keys(c), "rewards": c["rewards"]} for c in canonical])
    LOG.logger.addHandler(caplog.handler)
    try:
        assert _warn_suspicious_labels(part, RRHF, "rewards") == (1, 0)
        ucla = Dataset.from_list(
            [
                {"prompt_key": str(n), "response_keys": ["c", "r"], "win_rates": w}
                for n, w in enumerate([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5]])
            ]
        )
        ucla_entry = RowFormat(dataset="UCLA-AGI/x", type="pofe.sppo_ucla", method="sppo", fields={})
        assert _warn_suspicious_labels(ucla, ucla_entry, "win_rates", ["chosen_probs_win", "chosen_probs_lose"]) == (
            0,
            1,
        )
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert (
        "1 of 4 rows of data/c.jsonl rank two responses of a prompt in the opposite order to an earlier "
        "row with the same prompt (rows (0, 2))"
    ) in caplog.text
    assert "1 of 3 rows of UCLA-AGI/x have chosen_probs_win < chosen_probs_lose (rows 1)" in caplog.text


def test_sppo_rows_with_all_equal_win_rates_are_counted_and_warned(caplog):
    from pofe.data.loader import LOG, _warn_equal_labels
    from pofe.methods import SPPO as SPPO_SPEC

    LOG.logger.addHandler(caplog.handler)
    try:
        assert _warn_equal_labels([[1.0, 1.0], [0.7, 0.3]], "s.jsonl", SPPO_SPEC) == 1
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert "1 of 2 rows of s.jsonl have all-equal win rates; SPPO learns no preference" in caplog.text
