"""Text rows train as text (issue 44): TRL's standard, non-conversational preference layout
(`{"chosen": "16+11=27", "rejected": "16+11=21"}`, or with a text prompt column) is tokenised as
TRL's DPOTrainer tokenises it, without the chat template, unless the entry asks for one
(`prompt_format: chat`); POFE's own k-response rows keep their chat rendering unless they ask
for text (`prompt_format: text`).

TRL's tokenisation, worked here independently of POFE's code (trl 1.9's
`DPOTrainer._prepare_dataset`, standard rows): the prompt is `tokenizer(prompt)` with the
tokenizer's special tokens; eos_token is appended to each completion's text; the completion's ids
are what `tokenizer(prompt + completion + eos_token)` has after the prompt's ids. The tiny
tokenizer is character-level (one token per character, `<|end|>` one token, the eos), so every
count below is the number of characters.
"""

from __future__ import annotations

import json

import pytest

from pofe.columns import AS_TEXT, SPLIT_IN_WORD
from pofe.data.formats import PofeDataError, RowFormat, normalize_row
from pofe.data.tokenize import tokenize_row


def fmt(dtype="pofe.pairs", method="rrhf", **fields):
    return RowFormat(dataset="d.jsonl", type=dtype, method=method, fields=fields)


def tokenized(row, tokenizer):
    return tokenize_row(row, tokenizer, sequence_len=64, max_prompt_len=32, truncation="drop")


def trl_ids(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) as TRL's DPOTrainer makes them for a standard row."""
    prompt_ids = tokenizer(prompt)["input_ids"]
    joint = tokenizer(prompt + completion + tokenizer.eos_token)["input_ids"]
    return prompt_ids, joint[len(prompt_ids) :]


def with_bos(tokenizer):
    """The tiny tokenizer, adding BOS as Llama's does (a copy: the session's stays as it is)."""
    import copy

    from tokenizers.processors import TemplateProcessing

    tok = copy.deepcopy(tokenizer)
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
    )
    assert tok("ab")["input_ids"] == [tok.bos_token_id, *tokenizer("ab")["input_ids"]]
    return tok


@pytest.mark.parametrize("bos", [False, True])
def test_an_implicit_text_pair_is_tokenised_as_trl_tokenises_it(tokenizer, bos):
    """TRL splits "16+11=27" / "16+11=21" at their common prefix "16+11=2": responses "7" and "1".
    As text: prompt ids = tokenizer("16+11=2") (7 characters, BOS first when the tokenizer adds
    one), responses "7" + eos and "1" + eos, no role marker anywhere (the chat template would
    write <|user|> ... <|end|><|assistant|>: 3 more tokens around the prompt)."""
    tok = with_bos(tokenizer) if bos else tokenizer
    row = normalize_row({"chosen": "16+11=27", "rejected": "16+11=21"}, 0, fmt())
    assert row[AS_TEXT] and row[SPLIT_IN_WORD]
    out = tokenized(row, tok)
    prompt_ids, chosen = trl_ids(tok, "16+11=2", "7")
    _, rejected = trl_ids(tok, "16+11=2", "1")
    assert out["prompt_ids"] == prompt_ids and len(prompt_ids) == 7 + bos
    assert (
        out["response_ids"]
        == [chosen, rejected]
        == [
            tok("7<|end|>", add_special_tokens=False)["input_ids"],
            tok("1<|end|>", add_special_tokens=False)["input_ids"],
        ]
    )
    assert "<|user|>" not in tok.decode(out["prompt_ids"])
    assert out["eos_appended"] == 0  # a text row's eos is TRL's, not the template's missing stop


def test_a_text_prompt_column_trains_as_text_too():
    """Explicit text prompt (TRL's standard explicit layout): as text, no split counted."""
    row = normalize_row({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}, 0, fmt())
    assert row[AS_TEXT] and not row[SPLIT_IN_WORD]


def test_a_split_at_a_space_or_sign_is_not_inside_a_word():
    """TRL gives the space before the parting point to the responses ("The sky is" | " blue."),
    and "3+4=" | "7" parts after a sign: neither is counted."""
    for raw in (
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "3+4=7", "rejected": "3+4=8"},
    ):
        assert not normalize_row(raw, 0, fmt())[SPLIT_IN_WORD]


def test_prompt_format_chat_asks_for_the_chat_template(tokenizer):
    """The recipe asks for one: the split prompt is a user turn (7 characters + <|user|>,
    <|end|>, <|assistant|>), answered by "7" and its end of turn."""
    row = normalize_row({"chosen": "16+11=27", "rejected": "16+11=21"}, 0, fmt(prompt_format="chat"))
    assert not row[AS_TEXT] and row[SPLIT_IN_WORD]
    out = tokenized(row, tokenizer)
    assert tokenizer.decode(out["prompt_ids"]) == "<|user|>16+11=2<|end|><|assistant|>"


def test_conversational_pairs_keep_the_chat_template():
    row = normalize_row(
        {"prompt": [{"role": "user", "content": "Sky?"}], "chosen": "Blue.", "rejected": "Red."}, 0, fmt()
    )
    assert not row[AS_TEXT]


def test_k_response_rows_with_a_text_prompt_are_a_user_turn_unless_asked(tokenizer):
    """POFE's own layout (the candidate pipeline's data.jsonl: candidates sampled after the
    chat-templated prompt) keeps the chat template by default; `prompt_format: text` trains it
    as text."""
    raw = {"prompt": "12+7=", "responses": ["19", "18"], "rewards": [1.0, 0.0]}
    chat = tokenized(normalize_row(raw, 0, fmt("pofe.rrhf")), tokenizer)
    assert tokenizer.decode(chat["prompt_ids"]) == "<|user|>12+7=<|end|><|assistant|>"
    text = tokenized(normalize_row(raw, 0, fmt("pofe.rrhf", prompt_format="text")), tokenizer)
    assert text["prompt_ids"] == tokenizer("12+7=")["input_ids"]
    assert text["response_ids"] == [trl_ids(tokenizer, "12+7=", r)[1] for r in ("19", "18")]


def test_prompt_format_text_needs_a_text_prompt_and_not_pofe_prompts():
    with pytest.raises(PofeDataError, match=r"row 0 \(0-based\), field 'prompt': prompt_format: text reads a text"):
        normalize_row(
            {"prompt": [{"role": "user", "content": "Hi"}], "chosen": "a", "rejected": "b"},
            0,
            fmt(prompt_format="text"),
        )
    with pytest.raises(PofeDataError, match="prompt_format text on a pofe.prompts entry"):
        fmt("pofe.prompts", prompt_format="text")


def test_the_prompt_merging_into_a_response_is_tokenised_apart_and_counted():
    """A tokenizer that merges across the split (here a BPE with the merge "2" + "7" -> "27"):
    TRL takes the joint ids after the prompt's, which starts inside the prompt's last token;
    POFE tokenises the response alone (the prompt stays as the model sees it) and counts it."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<eos>", "1", "2", "6", "7", "+", "=", "27"])}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[("2", "7")]))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    assert tok("16+11=27")["input_ids"][-1] == vocab["27"]
    row = normalize_row({"chosen": "16+11=27", "rejected": "16+11=21"}, 0, fmt())
    out = tokenized(row, tok)
    assert out["prompt_ids"] == tok("16+11=2")["input_ids"]
    assert out["response_ids"] == [[vocab["7"], vocab["<eos>"]], [vocab["1"], vocab["<eos>"]]]
    assert out["prompt_token_merged"] == 1  # "7" merged with "2"; "1" did not


def test_a_text_prompt_is_rendered_for_evaluation_as_training_saw_it(tokenizer):
    """`axolotl pofe eval` samples from `prompt_token_ids(rendered)`, which adds no special tokens
    under a chat template: the rendered text writes out the BOS training's prompt ids began with."""
    from pofe_candidates.render import prompt_token_ids, text_prompt

    for tok in (tokenizer, with_bos(tokenizer)):
        assert prompt_token_ids(tok, text_prompt(tok, "16+11=2")) == tok("16+11=2")["input_ids"]


def test_the_loader_counts_text_rows_and_splits_inside_a_number(tmp_path, tiny_model, caplog):
    """Through `_prepare` (the loader axolotl's hooks call): rows 0 and 1 part inside a number
    ("16+11=2" | "7"), rows 2 and 3 after "=": an INFO line says all 4 train as text, a warning
    counts 2 split inside a word or number and names them."""
    import yaml
    from axolotl.cli.config import prepare_plugins
    from axolotl.utils.config import validate_config
    from axolotl.utils.dict import DictDefault
    from transformers import AutoTokenizer

    from pofe.args import pofe_config
    from pofe.data.debug_rows import show_splits
    from pofe.data.loader import LOG, _prepare
    from tests.helpers import recipe

    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in TEXT_PAIRS))
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
    # (axolotl's merge shuffles the rows)
    assert sorted(tokenizer.decode(p) for p in dataset["prompt_ids"]) == ["16+11=2", "17+11=2", "2+11=", "3+11="]
    assert f"4 of 4 rows of {data} are text (TRL's standard layout): trained as text" in caplog.text
    assert (
        f"2 of 4 rows of {data} have no prompt column and their responses part inside a word or number "
        "(rows 0, 1)" in caplog.text
    )
    # a base model without a chat template trains the same text rows
    tokenizer.chat_template = None
    bare = _prepare(cfg, pofe_config(cfg), tokenizer)
    assert sorted(bare["prompt_ids"]) == sorted(dataset["prompt_ids"])
    lines = show_splits(cfg, pofe_config(cfg), 3)
    assert lines[0] == (
        f"POFE {data} row 0, trained as text, no chat template: implicit prompt (the responses' shared start) "
        "'16+11=2' ENDS INSIDE A WORD OR NUMBER; responses '7', '1'"
    )
    assert len(lines) == 3 and "ENDS INSIDE" not in lines[2]


# rows 0, 1 part inside the answer's number; rows 2, 3 after "="
TEXT_PAIRS = [{"chosen": f"{i}+11={i + 11}", "rejected": f"{i}+11={i + 5}"} for i in (16, 17, 2, 3)]


def test_evaluation_renders_prompts_as_the_recipe_trained_them(tokenizer):
    """`axolotl pofe eval` of a model trained on a recipe's own rows samples each held-out prompt
    rendered as training rendered it: a text prompt of a pofe.pairs entry as text, chat messages
    (and any prompt of a pofe.rrhf entry) in the chat template."""
    from types import SimpleNamespace

    from pofe.run.evaluation.inputs import render_prompts, trained_as_text

    prompts = ["1+1=", [{"role": "user", "content": "x"}]]
    pcfg = SimpleNamespace(dataset_fields=[{}], method="rrhf")
    pairs = SimpleNamespace(datasets=[SimpleNamespace(path="d", type="pofe.pairs")])
    flags = trained_as_text(pairs, pcfg, prompts)
    assert flags == [True, False]
    assert render_prompts(tokenizer, prompts, flags) == ["1+1=", "<|user|>x<|end|><|assistant|>"]
    rrhf = SimpleNamespace(datasets=[SimpleNamespace(path="d", type="pofe.rrhf")])
    assert trained_as_text(rrhf, pcfg, prompts) == [False, False]
