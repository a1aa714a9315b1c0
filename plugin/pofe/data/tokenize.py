"""Render canonical rows with the chat template and tokenise prompt and responses.

The prompt is rendered with `add_generation_prompt=True`; each response is the text the
template adds after it for one assistant turn (so the end-of-turn tokens are scored,
and the model learns to stop). A template that writes no special token there (a base
model's `role: content` template) gets eos_token appended to each response, as TRL's
DPOTrainer appends it to completions it renders without a chat template
(`pofe_candidates.token_ids.turn_end`). Prompt and responses are tokenised apart, so the
collator can lay out each candidate as `prompt_ids + response_ids[j]` and score only
response tokens. A response the policy sampled (rows of the candidate pipeline carry
`response_ids`) is scored on its sampled ids plus the template's end of turn, not its
text tokenised again (`pofe_candidates.token_ids` says why). Rows longer than `sequence_len`
follow `pofe.truncation` (`length_policy.py`).

A text row (`AS_TEXT`: TRL's standard, non-conversational layout, `pofe.data.formats`) is
tokenised as TRL's DPOTrainer tokenises one, without the chat template: the prompt with the
tokenizer's special tokens (BOS), each response as what `prompt + response` adds to the prompt's
ids, ended by eos_token. Where the prompt's ids are not the start of that (its last token merges
with the response's first: a split inside a word), the response is tokenised alone, so the
prompt is scored as the model sees it when it generates; the loader counts such rows
(`PROMPT_TOKEN_MERGED`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

from pofe.columns import ANCHOR_LOGPS, AS_TEXT, candidate_float_columns
from pofe.length_policy import PROMPT_TOO_LONG, TOO_LONG, cut_collision, cut_response, fit_turns
from pofe.methods import label_columns
from pofe_candidates.render import ChatTemplateError, template_errors
from pofe_candidates.token_ids import NoStopTokenError, TurnEnd, response_text, turn_end

# how many of a tokenised row's responses got eos_token appended (`TurnEnd.finish`)
EOS_APPENDED = "eos_appended"
# how many of a text row's responses merge with the prompt's last token (tokenised alone instead)
PROMPT_TOKEN_MERGED = "prompt_token_merged"


def render_row(row: dict[str, Any], tokenizer) -> tuple[str, list[str]]:
    """Return the rendered prompt text and each response's text after it."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("prompt", "the tokenizer has no chat template (a row of chat messages needs one)")
    with template_errors("prompt"):
        prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    with template_errors("responses"):
        return prompt, [response_text(tokenizer, row["prompt"], prompt, m["content"]) for m in row["responses"]]


def response_token_ids(
    row: dict[str, Any], tokenizer, prompt: str, texts: list[str], end: TurnEnd
) -> tuple[list[list[int]], int]:
    """Each response's ids, ended by `end`, and how many got eos_token appended: its sampled ids
    when the row has them (`response_ids`, from the candidate pipeline), else its text (with
    the template's end of turn) tokenised alone."""
    sampled = row.get("response_ids") or [None] * len(texts)
    finished = [
        end.finish(tokenizer(text, add_special_tokens=False)["input_ids"], written=True)
        if ids is None
        else end.finish(list(ids))
        for text, ids in zip(texts, sampled, strict=True)
    ]
    return [ids for ids, _ in finished], sum(appended for _, appended in finished)


def text_rows_notes(
    dataset: str, as_text: list[bool], split_in_word: list[bool], merged: list[int]
) -> tuple[str | None, str | None]:
    """(an INFO line: how many of `dataset`'s rows train as text; a WARNING: rows whose implicit
    prompt ends inside a word or number, and text rows whose prompt's last token merges with a
    response), each None when there is nothing to say. Row indices are the entry's, 0-based."""
    from pofe.data.label_checks import shown

    total, text = len(as_text), sum(as_text)
    info = (
        f"POFE: {text} of {total} rows of {dataset} are text (TRL's standard layout): trained as text, without "
        "the chat template, each response ended by eos_token, as TRL's DPOTrainer trains them; `prompt_format: "
        "chat` on the entry renders them as a user turn of the chat template instead"
        if text
        else None
    )
    said = []
    if split := [i for i, x in enumerate(split_in_word) if x]:
        said.append(
            f"{len(split)} of {total} rows of {dataset} have no prompt column and their responses part inside a "
            f"word or number (rows {shown(split)}): the prompt, their shared start, ends mid-word, as TRL splits "
            '"16+11=27" / "16+11=21" into the prompt "16+11=2" answered by "7" and "1". Give a prompt column '
            "(or name it with field_prompt) to train the whole answer"
        )
    if into := [i for i, n in enumerate(merged) if n]:
        said.append(
            f"{sum(merged)} responses in {len(into)} text rows of {dataset} (rows {shown(into)}) begin inside the "
            "prompt's last token: each is tokenised apart from its prompt, so the prompt is scored as the model "
            "sees it when it generates"
        )
    return info, ("POFE: " + "; ".join(said) if said else None)


def check_stop_token(tokenizer) -> None:
    """Raise NoStopTokenError before any row is prepared (or candidate sampled) when a response
    could not end on a stop token (`turn_end`), judged on a one-turn chat. A template that
    raises on it is left to the rows, whose errors name them."""
    messages = [{"role": "user", "content": "Hello"}]
    try:
        with template_errors("prompt"):
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            turn_end(tokenizer, messages, prompt)
    except ChatTemplateError:
        return


def eos_appended_note(tokenizer, responses: int, rows: int) -> str:
    """The warning for `responses` responses (in `rows` rows) that got eos_token appended."""
    return (
        f"POFE: eos_token {tokenizer.eos_token!r} appended to {responses} responses in {rows} rows: the chat "
        f"template of {tokenizer.name_or_path} writes no special token after an assistant turn, so without it "
        "the model would never learn to stop (TRL's DPOTrainer appends it too). Set a `chat_template:` that "
        "ends each turn with a special token to train that one instead"
    )


def tokenize_row(
    row: dict[str, Any],
    tokenizer,
    *,
    sequence_len: int,
    max_prompt_len: int,
    truncation: Literal["truncate", "drop"],
) -> dict[str, Any]:
    """Tokenise one canonical row; returns ids, the length policy's record (`truncated`, `keep`,
    `drop_reason`, `turns_cut`, `responses_cut`), how many responses got eos_token appended
    (`EOS_APPENDED`) and the row's float columns. Raises ChatTemplateError when the template
    raises on the row.

    Policy when `len(prompt) + max_j len(response_j) > sequence_len` (`length_policy.py` says
    why each cut is made so): `truncate` cuts the prompt's oldest whole turns until it fits
    `max_prompt_len` (dropping the row when its last user turn alone does not), then cuts each
    response to the room left, without its end of turn, and drops the row when two cut responses
    became identical; `drop` drops the row. The caller filters rows with `keep=False` and counts
    them by `drop_reason`. Given anchor log-probs of a cut row are for the uncut row, so they are
    cleared (the trainer then computes the anchor for every row).
    """
    messages = row["prompt"]
    prompt_ids, response_ids, end, appended, merged = _encode(row, messages, tokenizer)
    too_long = len(prompt_ids) + max(len(r) for r in response_ids) > sequence_len
    out = {"truncated": too_long, "drop_reason": None, "turns_cut": 0, "responses_cut": 0}
    if too_long and truncation == "drop":
        out["drop_reason"] = TOO_LONG
    elif too_long:
        if len(prompt_ids) > max_prompt_len:
            # a text prompt has one turn: kept whole or dropped
            length = partial(_text_prompt_len if row.get(AS_TEXT) else _prompt_len, tokenizer)
            messages, out["turns_cut"] = fit_turns(messages, length, max_prompt_len)
            if messages is None:
                out["drop_reason"] = PROMPT_TOO_LONG
            else:
                prompt_ids, response_ids, end, appended, merged = _encode(row, messages, tokenizer)
        if messages is not None:
            response_ids, out["responses_cut"], out["drop_reason"] = _cut_responses(
                row, end, response_ids, sequence_len - len(prompt_ids)
            )
    out.update(prompt_ids=prompt_ids, response_ids=response_ids, keep=out["drop_reason"] is None)
    out[EOS_APPENDED], out[PROMPT_TOKEN_MERGED] = appended, merged
    for key in candidate_float_columns():
        if key in row:
            out[key] = row[key]
    if too_long and out.get(ANCHOR_LOGPS) is not None:
        out[ANCHOR_LOGPS] = None
    return out


def _encode(row: dict[str, Any], messages: list[dict[str, Any]], tokenizer):
    """The ids of the prompt `messages` and of each response after them, how a response ends
    (`TurnEnd`), how many responses got eos_token appended to a template's end of turn, and how
    many of a text row's responses merge with its prompt (`_encode_text`)."""
    if row.get(AS_TEXT):
        prompt_ids, response_ids, merged = text_token_ids(
            messages[-1]["content"], [m["content"] for m in row["responses"]], tokenizer
        )
        return prompt_ids, response_ids, text_end(tokenizer), 0, merged
    row = {**row, "prompt": messages}
    prompt_text, texts = render_row(row, tokenizer)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    with template_errors("responses"):
        end = turn_end(tokenizer, messages, prompt_text)
    response_ids, appended = response_token_ids(row, tokenizer, prompt_text, texts, end)
    return prompt_ids, response_ids, end, appended, 0


def text_end(tokenizer) -> TurnEnd:
    """How a text response ends: eos_token, which TRL appends to every completion it renders
    without a chat template (not counted as appended: text rows always get it)."""
    if tokenizer.eos_token_id is None:
        raise NoStopTokenError(
            f"the tokenizer of {tokenizer.name_or_path} has no eos_token, which a response trained as text "
            "ends with (TRL appends it too), so the model would never learn to stop. Set it in the recipe "
            "(`special_tokens: {eos_token: ...}`), or train the rows in a chat template (`prompt_format: chat`)"
        )
    return TurnEnd([], tokenizer.eos_token_id, eos_appended=True)


def text_token_ids(prompt: str, responses: list[str], tokenizer) -> tuple[list[int], list[list[int]], int]:
    """A text row's ids as TRL's DPOTrainer makes them (see the module): (the prompt's, each
    response's ended by eos_token, how many responses merge with the prompt's last token)."""
    prompt_ids = tokenizer(prompt)["input_ids"]  # with the tokenizer's special tokens (BOS), as TRL
    end, out, merged = text_end(tokenizer), [], 0
    for response in responses:
        joint = tokenizer(prompt + response)["input_ids"]
        if joint[: len(prompt_ids)] == prompt_ids:
            ids = joint[len(prompt_ids) :]
        else:  # the prompt's last token merges with the response's first: tokenised apart
            ids, merged = tokenizer(response, add_special_tokens=False)["input_ids"], merged + 1
        out.append(end.finish(ids)[0])
    return prompt_ids, out, merged


def _text_prompt_len(tokenizer, messages: list[dict[str, Any]]) -> int:
    return len(tokenizer(messages[-1]["content"])["input_ids"])


def _prompt_len(tokenizer, messages: list[dict[str, Any]]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _cut_responses(row, end: TurnEnd, response_ids: list[list[int]], room: int):
    """Responses cut to `room` ids (`cut_response`: without `end`, eos_token included), how many
    were cut, and the drop reason of a row whose cut responses collide (`cut_collision`)."""
    cut = [r if len(r) <= room else cut_response(r, end.ids, room) for r in response_ids]
    n = sum(len(r) > room for r in response_ids)
    labels = [row[c] for c in label_columns() if row.get(c) is not None]
    return cut, n, cut_collision(response_ids, cut, labels) if n else None
