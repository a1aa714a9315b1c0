"""`prompt_format: hh`: Anthropic HH transcripts read as chat turns, on rows written as HH writes them."""

from __future__ import annotations

import pytest

from pofe.data.formats import PofeDataError, RowFormat, check_columns, normalize_row, prompt_row

# a two-exchange conversation with a blank line inside the second Human turn, as
# Anthropic/hh-rlhf writes it: one string, every turn after "\n\n"
PROMPT = (
    "\n\nHuman: What are some good vegetables to plant in early spring?"
    "\n\nAssistant: Peas, spinach, lettuce and radishes all tolerate a light frost."
    "\n\nHuman: My garden is small.\n\nWhich of those grows fastest?"
    "\n\nAssistant:"
)
TURNS = [
    {"role": "user", "content": "What are some good vegetables to plant in early spring?"},
    {"role": "assistant", "content": "Peas, spinach, lettuce and radishes all tolerate a light frost."},
    {"role": "user", "content": "My garden is small.\n\nWhich of those grows fastest?"},
]
CHOSEN = "Radishes: many are ready about four weeks after sowing.\n\nSow a short row every week."
REJECTED = "I don't know."


def fmt(type_="pofe.pairs", method="rrhf", **fields):
    return RowFormat(dataset="hh.jsonl", type=type_, method=method, fields={"prompt_format": "hh", **fields})


def test_anthropic_rows_without_a_prompt_column():
    """Anthropic/hh-rlhf: chosen and rejected are whole transcripts; the prompt is their shared
    turns, each response the text after the last 'Assistant:' (blank lines kept)."""
    raw = {"chosen": PROMPT + " " + CHOSEN, "rejected": PROMPT + " " + REJECTED}
    check_columns(fmt(), list(raw))  # no prompt column needed with hh pairs
    row = normalize_row(raw, 0, fmt())
    assert row == {
        "prompt": TURNS,
        "responses": [{"role": "assistant", "content": CHOSEN}, {"role": "assistant", "content": REJECTED}],
        "rewards": [1.0, 0.0],
        "source_prompt": TURNS,  # as a judge reads it: the transcript's turns
        "as_text": False,
        "split_in_word": False,
    }
    assert normalize_row(raw, 0, fmt(method="sppo"))["win_rates"] == [1.0, 0.0]


def test_dahoas_rows_with_a_prompt_and_bare_responses():
    """Dahoas/rm-static: the prompt ends at 'Assistant:', chosen/rejected hold the text after it
    (with its leading space). A k-response row may mix bare texts and transcripts."""
    raw = {"prompt": PROMPT, "chosen": " " + CHOSEN, "rejected": " " + REJECTED}
    row = normalize_row(raw, 3, fmt())
    assert row["prompt"] == TURNS and [m["content"] for m in row["responses"]] == [CHOSEN, REJECTED]
    raw = {
        "question": PROMPT,
        "responses": [" " + CHOSEN, PROMPT + " " + REJECTED, "Lettuce."],
        "rewards": [2.0, 0.5, 1.0],
    }
    row = normalize_row(raw, 0, fmt("pofe.rrhf", field_prompt="question"))
    assert row["prompt"] == TURNS
    assert [m["content"] for m in row["responses"]] == [CHOSEN, REJECTED, "Lettuce."]


def test_chat_format_keeps_the_transcript_as_one_user_turn():
    """The default reads text as it is: what `hh` exists to change."""
    row = normalize_row(
        {"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED},
        0,
        RowFormat(dataset="d", type="pofe.pairs", method="rrhf", fields={}),
    )
    assert row["prompt"] == [{"role": "user", "content": PROMPT}]


def test_prompt_rows_for_generation():
    """pofe.prompts: the prompt becomes turns and the dataset responses named by
    generate.include_dataset_responses become the texts that join the candidates."""
    prompts = fmt("pofe.prompts")
    row = prompt_row(
        {"prompt": PROMPT, "chosen": " " + CHOSEN, "rejected": " " + REJECTED, "id": 7},
        0,
        prompts,
        ["chosen", "rejected"],
    )
    assert row == {"prompt": TURNS, "chosen": CHOSEN, "rejected": REJECTED, "id": 7}
    # Anthropic/hh-rlhf rows: the prompt comes from the chosen transcript
    row = prompt_row(
        {"chosen": PROMPT + " " + CHOSEN, "rejected": PROMPT + " " + REJECTED}, 0, prompts, ["chosen", "rejected"]
    )
    assert row == {"prompt": TURNS, "chosen": CHOSEN, "rejected": REJECTED}
    plain = RowFormat(dataset="d", type="pofe.prompts", method="rrhf", fields={})
    assert prompt_row({"prompt": PROMPT}, 0, plain, []) == {"prompt": PROMPT}


BAD = [
    ({"prompt": "What grows fastest?\n\nAssistant:"}, "prompt", "text before the first turn: 'What grows fastest?'"),
    ({"prompt": "Plant peas."}, "prompt", "no 'Human:' turn in 'Plant peas.', so not an HH transcript"),
    (
        {"prompt": "\n\nHuman: a\n\nHuman: b\n\nAssistant:"},
        "prompt",
        "turn 2 is 'Human:' where 'Assistant:' should follow",
    ),
    ({"prompt": "\n\nAssistant: hi\n\nHuman: a\n\nAssistant:"}, "prompt", "turn 1 is 'Assistant:' where 'Human:'"),
    ({"prompt": "\n\nHuman: a\n\nAssistant:\n\nHuman: b\n\nAssistant:"}, "prompt", "turn 2 ('Assistant:') is empty"),
    (
        {"prompt": "\n\nHuman: a\n\nAssistant: b"},
        "prompt",
        "the transcript does not end with an empty 'Assistant:' turn",
    ),
    (
        {"prompt": PROMPT, "rejected": "\n\nHuman: other\n\nAssistant: x"},
        "rejected",
        "its transcript answers a different conversation than the row's prompt",
    ),
    (
        {"prompt": None, "chosen": PROMPT, "rejected": PROMPT + " x"},
        "chosen",
        "the transcript does not end with a non-empty 'Assistant:' turn",
    ),
]


@pytest.mark.parametrize("update,field,message", BAD)
def test_malformed_transcripts_name_dataset_row_field(update, field, message):
    raw = {"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED, **update}
    if raw["prompt"] is None:
        del raw["prompt"]
    with pytest.raises(PofeDataError) as err:
        normalize_row(raw, 5, fmt())
    assert str(err.value).startswith(f"dataset hh.jsonl, row 5 (0-based), field '{field}': {message}")


def test_unknown_prompt_format_is_refused():
    with pytest.raises(
        PofeDataError, match=r"dataset d: prompt_format 'anthropic' is not one of \['auto', 'chat', 'text', 'hh'\]"
    ):
        RowFormat(dataset="d", type="pofe.pairs", method="rrhf", fields={"prompt_format": "anthropic"})
