"""How a trained response ends (bad case 1 of issue 33), and a chat template that raises on a
row (weak case 7).

The tiny character-level tokenizer (`pofe.demo.tiny`): ids 0-6 are its special tokens
(`<|end|>`, its eos_token, is 2), then "\\n" is 7 and printable ASCII starts at " " = 8, so
"1" = 8 + 0x31 - 0x20 = 25, "9" = 33, "2" = 26.
"""

from __future__ import annotations

import json
from unittest import mock

import pytest

from pofe.data.formats import PofeDataError
from pofe.data.tokenize import EOS_APPENDED, check_stop_token, tokenize_row
from pofe.demo.tiny import build_tokenizer
from pofe_candidates.render import ChatTemplateError
from pofe_candidates.token_ids import NoStopTokenError

EOS, NEWLINE, ONE, NINE, TWO = 2, 7, 25, 33, 26
# a base model's template: `role: content` lines, no token that ends a turn
PLAIN = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# Mistral v0.2's check, on the tiny tokenizer's turns
ALTERNATING = (
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tokenizer(template: str | None = None, eos: bool = True):
    tok = build_tokenizer()
    if template is not None:
        tok.chat_template = template
    if not eos:
        tok.eos_token = None
    return tok


def row(responses=("19", "2"), prompt="12+7=", **extra) -> dict:
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return {
        "prompt": messages,
        "responses": [{"role": "assistant", "content": r} for r in responses],
        "rewards": [1.0, 0.0],
        **extra,
    }


def tokenized(case: dict, tok) -> dict:
    return tokenize_row(case, tok, sequence_len=64, max_prompt_len=32, truncation="truncate")


def test_a_template_that_ends_no_turn_gets_eos_token_appended():
    """The plain template writes "19\\n" after "assistant: ": no special token, so eos_token
    follows: [1, 9, \\n, eos], [2, \\n, eos], one eos each, both counted."""
    out = tokenized(row(), tokenizer(PLAIN))
    assert out["response_ids"] == [[ONE, NINE, NEWLINE, EOS], [TWO, NEWLINE, EOS]]
    assert [r.count(EOS) for r in out["response_ids"]] == [1, 1]
    assert out[EOS_APPENDED] == 2


def test_sampled_ids_that_end_with_eos_keep_one():
    """Sampled ids: [1, 9] gets the template's "\\n" and eos; [2, eos] already stopped, so
    it is trained as sampled, and only the first counts as appended."""
    case = row(response_ids=[[ONE, NINE], [TWO, EOS]])
    out = tokenized(case, tokenizer(PLAIN))
    assert out["response_ids"] == [[ONE, NINE, NEWLINE, EOS], [TWO, EOS]]
    assert out[EOS_APPENDED] == 1


def test_a_template_that_ends_its_turns_is_trained_as_it_writes_them():
    """The tiny template's `<|end|>` is the stop token: nothing appended; a sampled [1, 9,
    <|end|>] (a backend that left its stop token on) keeps its one."""
    tok = tokenizer()
    out = tokenized(row(), tok)
    assert (out["response_ids"], out[EOS_APPENDED]) == ([[ONE, NINE, EOS], [TWO, EOS]], 0)
    out = tokenized(row(response_ids=[[ONE, NINE, EOS], [TWO]]), tok)
    assert (out["response_ids"], out[EOS_APPENDED]) == ([[ONE, NINE, EOS], [TWO, EOS]], 0)


def test_a_cut_response_loses_the_appended_eos_too():
    """prompt "user: 12+7=\\nassistant: " = 6 + 5 + 1 + 11 = 23 ids, sequence_len 27: room 4.
    "1234" + "\\n" + eos (6) is cut to its first 4 content ids, without "\\n" or eos (the model
    is not taught to stop there); "2" + "\\n" + eos (3) is whole."""
    out = tokenize_row(
        row(responses=("1234", "2")), tokenizer(PLAIN), sequence_len=27, max_prompt_len=23, truncation="truncate"
    )
    assert out["response_ids"] == [[ONE, TWO, 27, 28], [TWO, NEWLINE, EOS]]
    assert (out["responses_cut"], out["keep"]) == (1, True)


def test_no_eos_token_and_no_turn_end_is_an_error_naming_the_fix():
    tok = tokenizer(PLAIN, eos=False)
    tok.name_or_path = "base-model-7b"
    expected = (
        r"the tokenizer of base-model-7b has no eos_token and its chat template writes no special token after "
        r"an assistant turn \(only '\\n'\).*`special_tokens: \{eos_token: \.\.\.\}`.*`chat_template:`"
    )
    with pytest.raises(NoStopTokenError, match=expected):
        check_stop_token(tok)
    with pytest.raises(NoStopTokenError, match=expected):
        tokenized(row(), tok)
    check_stop_token(tokenizer(eos=False))  # the template's `<|end|>` is enough


def prepare(tmp_path, tiny_model, rows: list[dict], tok):
    """The loader's `_prepare` on `rows` as a pofe.rrhf dataset, and every warning it logged
    (each call once, whatever handlers the logger has)."""
    import yaml

    from pofe.args import pofe_config
    from pofe.data.loader import LOG, _prepare
    from tests.helpers import CPU, recipe, validated_recipe

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = validated_recipe(yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf").read_text()), CPU)
    with mock.patch.object(LOG, "warning") as warning:
        dataset = _prepare(cfg, pofe_config(cfg), tok)
    return dataset, [c.args[0] for c in warning.call_args_list]


def test_the_loader_warns_once_with_the_count(tmp_path, tiny_model):
    """Three rows of two responses, one response ending in eos_token's text already: 5 of 6
    get eos_token appended, in 3 rows; one warning says so and why."""
    rows = [
        {"prompt": p, "responses": r, "rewards": [1.0, 0.0]} for p, r in [("1+1=", ["2", "3"]), ("2+2=", ["4", "5"])]
    ]
    rows.append({"prompt": "3+3=", "responses": ["6<|end|>", "7"], "rewards": [1.0, 0.0]})
    tok = tokenizer(PLAIN)
    dataset, warnings = prepare(tmp_path, tiny_model, rows, tok)
    assert EOS_APPENDED not in dataset.column_names
    assert all(r.count(EOS) == 1 and r[-1] == EOS for rs in dataset["response_ids"] for r in rs)
    assert [w for w in warnings if "eos_token" in w] == [
        f"POFE: eos_token '<|end|>' appended to 5 responses in 3 rows: the chat template of {tok.name_or_path} "
        "writes no special token after an assistant turn, so without it the model would never learn to stop "
        "(TRL's DPOTrainer appends it too). Set a `chat_template:` that ends each turn with a special token to "
        "train that one instead"
    ]


def test_a_template_that_raises_names_the_dataset_row_field_and_fix(tmp_path, tiny_model):
    """Row 1's prompt has two user turns in a row, which Mistral's template refuses."""
    rows = [
        {"prompt": "1+1=", "responses": ["2", "3"], "rewards": [1.0, 0.0]},
        {
            "prompt": [{"role": "user", "content": "hi"}, {"role": "user", "content": "2+2="}],
            "responses": ["4", "5"],
            "rewards": [1.0, 0.0],
        },
    ]
    tok = tokenizer(ALTERNATING)
    with pytest.raises(PofeDataError) as raised:
        prepare(tmp_path, tiny_model, rows, tok)
    data = tmp_path / "rows.jsonl"
    assert str(raised.value) == (
        f"dataset {data}, row 1 (0-based), field 'prompt': the chat template of {tok.name_or_path} raised: "
        "Conversation roles must alternate user/assistant/user/assistant/.... Give this row's messages in the "
        "roles and order the template accepts (e.g. user and assistant turns alternating, a system message only "
        "first), or set `chat_template:` to one that accepts them (e.g. chatml)."
    )


def test_a_template_that_raises_on_a_response_names_the_responses():
    """A template that refuses assistant turns renders the prompt but not a response."""
    refuses = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ raise_exception('no assistant turns') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(ChatTemplateError) as raised:
        tokenized(row(), tokenizer(refuses))
    assert (raised.value.field, raised.value.message) == ("responses", "no assistant turns")


def test_a_template_that_raises_on_a_prompt_to_sample_names_the_dataset_and_row(tmp_path, tiny_model, monkeypatch):
    """The same refusal where candidates are sampled (a `pofe.prompts` entry): the generate
    stage renders row 2's prompt (two user turns) and the error names the dataset and the row,
    as the loader's does, not jinja's words alone."""
    from axolotl.utils.dict import DictDefault

    from pofe.args import pofe_config
    from pofe.data import candidates

    tok = tokenizer(ALTERNATING)
    monkeypatch.setattr(candidates, "load_tokenizer", lambda cfg: tok)
    cfg = DictDefault(
        base_model=str(tiny_model),
        dataset_prepared_path=None,
        pofe={
            "method": "rrhf",
            "generate": {"num_candidates": 2, "max_new_tokens": 2},
            "judge": {"type": "python", "function": "pofe.demo.task:reward"},
            "candidates": {"out_dir": str(tmp_path / "candidates"), "progress": False},
        },
    )
    two_users = [{"role": "user", "content": "hi"}, {"role": "user", "content": "3+3="}]
    prompts = [{"prompt": "1+1="}, {"prompt": "2+2="}, {"prompt": two_users}]
    entry = DictDefault(path="prompts.jsonl", split="train")
    with pytest.raises(PofeDataError) as raised:
        candidates.build_candidates(cfg, pofe_config(cfg), entry, prompts, "prompt", stop_after="generate")
    assert str(raised.value) == (
        f"dataset prompts.jsonl, row 2 (0-based), field 'prompt': the chat template of {tok.name_or_path} raised: "
        "Conversation roles must alternate user/assistant/user/assistant/.... Give this row's messages in the "
        "roles and order the template accepts (e.g. user and assistant turns alternating, a system message only "
        "first), or set `chat_template:` to one that accepts them (e.g. chatml)."
    )
