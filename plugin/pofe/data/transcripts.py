"""Anthropic HH transcripts as chat messages (`prompt_format: hh` on a `datasets:` entry).

HH (Bai et al. 2022, `Anthropic/hh-rlhf`) and its cleaned copies (`Dahoas/rm-static`)
write a conversation as one string, "\\n\\nHuman: ...\\n\\nAssistant: ...", turns alternating
and starting with Human. Read as a plain prompt it would become one user turn holding the
whole transcript, chat template and all; here it becomes user/assistant messages:

- a prompt ends with an empty "Assistant:", the generation point: the turns before it
  are the prompt (`Dahoas/rm-static`'s `prompt` column);
- a response is either the bare text after that point (`Dahoas/rm-static`'s `chosen`
  and `rejected`) or a whole transcript whose final Assistant turn is the response and
  whose earlier turns must be the prompt (`Anthropic/hh-rlhf`'s `chosen` and `rejected`,
  which also give the prompt when the row has no prompt column).

A turn may hold blank lines; only "\\n\\nHuman:" and "\\n\\nAssistant:" start a turn.
Every malformed transcript is an error through the caller's `fail(field, what, fix)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# a turn starts at the text's start or after a blank line
_TURN = re.compile(r"(?:\A\s*|\n\n)(Human|Assistant):")
_ROLES = {"Human": "user", "Assistant": "assistant"}
_FIX = (
    "Write it as '\\n\\nHuman: ...\\n\\nAssistant: ...', turns alternating from Human, or "
    "remove `prompt_format: hh` from this dataset if it is not an HH transcript."
)

Fail = Callable[[str, str, str], Exception]


def hh_turns(text: str, field: str, fail: Fail) -> list[dict[str, str]]:
    """All turns of a transcript as {role, content}; the last may be empty."""
    parts = _TURN.split(text)  # [before, role_1, content_1, role_2, content_2, ...]
    if len(parts) == 1:
        raise fail(field, f"no 'Human:' turn in {text[:60]!r}, so not an HH transcript", _FIX)
    if parts[0].strip():
        raise fail(field, f"text before the first turn: {parts[0].strip()[:60]!r}", _FIX)
    roles, contents = parts[1::2], [c.strip() for c in parts[2::2]]
    for i, role in enumerate(roles):
        expected = "Human" if i % 2 == 0 else "Assistant"
        if role != expected:
            raise fail(field, f"turn {i + 1} is '{role}:' where '{expected}:' should follow", _FIX)
        if not contents[i] and i < len(roles) - 1:
            raise fail(field, f"turn {i + 1} ('{role}:') is empty", "Remove the row, or give the turn its text.")
    return [{"role": _ROLES[r], "content": c} for r, c in zip(roles, contents)]


def hh_prompt(text: str, field: str, fail: Fail) -> list[dict[str, str]]:
    """The chat messages of a prompt transcript, which ends with an empty 'Assistant:'."""
    turns = hh_turns(text, field, fail)
    if turns[-1]["role"] != "assistant" or turns[-1]["content"]:
        raise fail(
            field,
            "the transcript does not end with an empty 'Assistant:' turn, the point where the response goes",
            "End each prompt with '\\n\\nAssistant:'.",
        )
    return turns[:-1]


def hh_conversation(text: str, field: str, fail: Fail) -> tuple[list[dict[str, str]], str]:
    """(prompt messages, response) of a whole transcript: its final Assistant turn answers the rest."""
    turns = hh_turns(text, field, fail)
    if turns[-1]["role"] != "assistant" or not turns[-1]["content"]:
        raise fail(
            field,
            "the transcript does not end with a non-empty 'Assistant:' turn, the response",
            "Give the whole conversation, ending with the assistant's answer.",
        )
    return turns[:-1], turns[-1]["content"]


def hh_response(text: str, field: str, fail: Fail, prompt: list[dict[str, str]]) -> str:
    """The response in `text`: bare text as is (stripped), or a transcript's final
    Assistant turn, whose earlier turns must equal `prompt`."""
    if not _TURN.search(text):
        return text.strip()
    conversation, response = hh_conversation(text, field, fail)
    if conversation != prompt:
        raise fail(
            field,
            "its transcript answers a different conversation than the row's prompt",
            "Every response of a row must continue the same prompt.",
        )
    return response


def hh_row(row: dict[str, Any], prompt_column: str, response_columns: list[str], fail: Fail) -> dict[str, Any]:
    """`row` with its prompt as chat messages and its responses as text.

    Each response column holds one response or a list of them. Without a prompt column
    the prompt is the conversation of the first response column's transcript.
    """
    row = dict(row)
    value = row.get(prompt_column)
    if value is None and response_columns and isinstance(row.get(response_columns[0]), str):
        prompt, _ = hh_conversation(row[response_columns[0]], response_columns[0], fail)
    elif isinstance(value, str):
        prompt = hh_prompt(value, prompt_column, fail)
    else:
        raise fail(
            prompt_column,
            f"expected an HH transcript (text), got {value!r:.80}",
            "Give the prompt column, or whole transcripts in the responses (Anthropic/hh-rlhf's "
            "chosen and rejected), or remove `prompt_format: hh`.",
        )
    row[prompt_column] = prompt
    for col in response_columns:
        value = row.get(col)
        if isinstance(value, str):
            row[col] = hh_response(value, col, fail, prompt)
        elif isinstance(value, (list, tuple)):
            row[col] = [
                hh_response(v, f"{col}[{j}]", fail, prompt) if isinstance(v, str) else v for j, v in enumerate(value)
            ]
    return row
