"""TRL's preference layouts read as TRL reads them (issue 34): explicit or implicit prompt,
conversational or plain text, and `score_chosen` / `score_rejected` as the pair's labels.

The expected prompts and responses are worked out by hand from TRL's rule (the prompt is the
longest shared prefix of chosen and rejected; for texts, a space just before the point where
they part goes with the responses)."""

from __future__ import annotations

import pytest

from pofe.data.formats import PofeDataError, RowFormat, check_columns, normalize_row

pytestmark = pytest.mark.trl  # TRL's layouts, read with trl.data_utils


def fmt(dtype="pofe.pairs", method="rrhf", **fields):
    return RowFormat(dataset="trl-lib/x", type=dtype, method=method, fields=fields)


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def texts(row):
    return [m["content"] for m in row["responses"]]


def test_explicit_prompt_conversational():
    row = normalize_row(
        {"prompt": [user("Sky?")], "chosen": [assistant("Blue.")], "rejected": [assistant("Green.")]}, 0, fmt()
    )
    assert row["prompt"] == [user("Sky?")] and texts(row) == ["Blue.", "Green."]
    assert row["rewards"] == [1.0, 0.0]


def test_implicit_prompt_conversational():
    """trl-lib/ultrafeedback_binarized's layout: no prompt column, whole conversations."""
    raw = {
        "chosen": [user("What color is the sky?"), assistant("It is blue.")],
        "rejected": [user("What color is the sky?"), assistant("It is green.")],
    }
    check_columns(fmt(), list(raw))  # no prompt column: not required
    row = normalize_row(raw, 0, fmt(method="sppo"))
    assert row["prompt"] == [user("What color is the sky?")]
    assert texts(row) == ["It is blue.", "It is green."]
    assert row["win_rates"] == [1.0, 0.0]


def test_implicit_prompt_multi_turn():
    """Five shared turns (system, user, assistant, user) before the answers that differ: the
    prompt is those four turns, each response the one assistant turn after them."""
    shared = [{"role": "system", "content": "Be brief."}, user("2+2?"), assistant("4."), user("And 3+3?")]
    raw = {"chosen": shared + [assistant("6.")], "rejected": shared + [assistant("7.")]}
    row = normalize_row(raw, 3, fmt())
    assert row["prompt"] == shared
    assert texts(row) == ["6.", "7."]


def test_implicit_prompt_plain_text():
    """'The sky is blue.' / 'The sky is green.': they part at index 11 ('b' vs 'g'); index 10 is
    a space, which TRL gives to the responses: prompt 'The sky is', responses ' blue.', ' green.'."""
    row = normalize_row({"chosen": "The sky is blue.", "rejected": "The sky is green."}, 0, fmt())
    assert row["prompt"] == [user("The sky is")]
    assert texts(row) == [" blue.", " green."]


def test_explicit_prompt_plain_text_unchanged():
    row = normalize_row({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}, 0, fmt())
    assert row["prompt"] == [user("The sky is")] and texts(row) == [" blue.", " green."]


def test_k_conversations_without_a_prompt_column():
    """pofe.rrhf and pofe.sppo rows whose responses are whole conversations: the prompt is the
    turns all k share (row 1 parts from row 0 after the user turn, as do the others)."""
    q = [user("12+7=")]
    raw = {
        "responses": [q + [assistant("19")], q + [assistant("18")], q + [assistant("21")]],
        "rewards": [1.0, 0.25, 1 / 6],
    }
    row = normalize_row(raw, 0, fmt("pofe.rrhf"))
    assert row["prompt"] == q and texts(row) == ["19", "18", "21"]
    raw = {"responses": raw["responses"], "win_rates": [0.9, 0.4, 0.2]}
    assert normalize_row(raw, 0, fmt("pofe.sppo", "sppo"))["prompt"] == q


@pytest.mark.parametrize(
    "scores,rewards,win_rates",
    [((8.5, 3.0), [8.5, 3.0], [1.0, 0.0]), ((5.0, 5.0), [5.0, 5.0], [0.5, 0.5]), ((2.0, 6.0), [2.0, 6.0], [0.0, 1.0])],
)
def test_scores_become_the_labels(scores, rewards, win_rates):
    """RRHF: the scores are the rewards. SPPO: P(chosen beats rejected) from the scores (1, 1/2
    on a tie, 0) and its complement."""
    raw = {"prompt": "p", "chosen": "a", "rejected": "b", "score_chosen": scores[0], "score_rejected": scores[1]}
    assert normalize_row(raw, 0, fmt())["rewards"] == rewards
    assert normalize_row(raw, 0, fmt(method="sppo"))["win_rates"] == win_rates
    renamed = {"prompt": "p", "chosen": "a", "rejected": "b", "good": scores[0], "bad": scores[1]}
    custom = fmt(field_score_chosen="good", field_score_rejected="bad")
    assert normalize_row(renamed, 0, custom)["rewards"] == rewards


def test_a_bad_score_is_named():
    raw = {"prompt": "p", "chosen": "a", "rejected": "b", "score_chosen": 1.0, "score_rejected": "high"}
    with pytest.raises(
        PofeDataError, match=r"row 2 \(0-based\), field 'score_rejected': expected a number, got 'high'"
    ):
        normalize_row(raw, 2, fmt())
    with pytest.raises(PofeDataError, match=r"missing column\(s\) \['score_rejected'\] for type pofe.pairs"):
        check_columns(fmt(), ["prompt", "chosen", "rejected", "score_chosen"])


BAD = [
    (
        {
            "chosen": [user("a"), assistant("b"), user("c"), assistant("d")],
            "rejected": [user("a"), assistant("x"), user("c"), assistant("y")],
        },
        "field 'chosen': continues the prompt the responses share with 3 turns, not one response",
    ),
    (
        {"chosen": [user("a"), assistant("b")], "rejected": [user("z"), assistant("b")]},
        "field 'rejected': shares no leading turn with chosen",
    ),
    (
        {"chosen": "Yes.", "rejected": "No."},
        "field 'rejected': shares no leading text with chosen, so there is no prompt",
    ),
    # TRL's rule alone would wrap around here and take 'Yes' as the prompt
    (
        {"chosen": "Yes ", "rejected": "No "},
        "field 'rejected': shares no leading text with chosen, so there is no prompt",
    ),
    (
        {"chosen": [user("a"), assistant("b")], "rejected": "b"},
        "field 'rejected': is text where chosen is a conversation",
    ),
]


@pytest.mark.parametrize("raw,message", BAD)
def test_implicit_prompts_that_cannot_be_read_are_named(raw, message):
    with pytest.raises(PofeDataError) as err:
        normalize_row(raw, 5, fmt())
    assert str(err.value).startswith("dataset trl-lib/x, row 5 (0-based), ")
    assert message in str(err.value)


def test_k_texts_without_a_prompt_column_are_refused():
    """A shared start of k free texts is as likely chance as a prompt: only pairs read one."""
    raw = {"responses": ["The answer is 4", "The answer is 5"], "rewards": [1.0, 0.0]}
    with pytest.raises(PofeDataError, match=r"field 'responses\[0\]': no prompt column, and the responses are texts"):
        normalize_row(raw, 0, fmt("pofe.rrhf"))


def test_an_unpaired_dataset_is_named_as_such():
    with pytest.raises(PofeDataError, match="TRL's unpaired layout \\(completion, label: KTO's\\)"):
        check_columns(fmt(), ["prompt", "completion", "label"])


def test_the_loader_says_where_the_prompts_come_from_and_counts_reversed_scores(tmp_path, tiny_model, caplog):
    """Through the loader (`_prepare`): an implicit-prompt dataset with scores, as
    trl-lib/ultrafeedback_binarized lays it out. Row 1's rejected scored higher: counted. The
    prompt tokens are the chat template's rendering of the shared user turn."""
    import json

    import yaml
    from axolotl.cli.config import prepare_plugins
    from axolotl.utils.config import validate_config
    from axolotl.utils.dict import DictDefault
    from transformers import AutoTokenizer

    from pofe.args import pofe_config
    from pofe.data.loader import LOG, _prepare
    from tests.helpers import recipe

    rows = [
        {
            "chosen": [user("1+1="), assistant("2")],
            "rejected": [user("1+1="), assistant("3")],
            "score_chosen": 9.0,
            "score_rejected": 2.0,
        },
        {
            "chosen": [user("2+2="), assistant("4")],
            "rejected": [user("2+2="), assistant("5")],
            "score_chosen": 1.0,
            "score_rejected": 7.0,
        },
    ]
    data = tmp_path / "ufb.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DictDefault(yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.pairs").read_text()))
    prepare_plugins(cfg)
    cfg = validate_config(
        cfg,
        capabilities={"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None},
        env_capabilities={"torch_version": "2.13.0"},
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    LOG.logger.addHandler(caplog.handler)
    try:
        dataset = _prepare(cfg, pofe_config(cfg), tokenizer)
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert dataset["rewards"] == [[9.0, 2.0], [1.0, 7.0]]
    assert tokenizer.decode(dataset[0]["prompt_ids"]) == "<|user|>1+1=<|end|><|assistant|>"
    assert (
        f"dataset {data} has no 'prompt' column: each row's prompt is the shared start of its chosen and rejected"
        in caplog.text
    )
    assert f"1 of 2 rows of {data} have score_chosen < score_rejected (rows 1)" in caplog.text
