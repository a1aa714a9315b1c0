"""Chat messages checked: a prompt's turns and a response's one assistant message.

Every problem goes through the caller's `fail(field, what, fix)`, which names the dataset
and the row (`formats.row_error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The roles a prompt message may have: chat templates render whatever role they are given, so a
# misspelt one ("usr") would be trained on as written
CHAT_ROLES = ("system", "user", "assistant", "tool")


def prompt_messages(value: Any, col: str, fail) -> list[dict[str, str]]:
    """A prompt (text: one user turn; or {role, content} messages) as chat messages, checked:
    known roles, text in every message, no closing assistant turn."""
    fix = "A prompt is a non-empty string or a list of {role, content} messages."
    if isinstance(value, str):
        if not value.strip():
            raise fail(col, "the prompt is empty", fix)
        return [{"role": "user", "content": value}]
    if isinstance(value, (list, tuple)) and value:
        messages = []
        for i, m in enumerate(value):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise fail(col, f"message {m!r} is not a {{role, content}} mapping", fix)
            if m["role"] not in CHAT_ROLES:
                raise fail(
                    f"{col}[{i}].role",
                    f"unknown role {m['role']!r}",
                    f"Use one of {list(CHAT_ROLES)}: the chat template would render any other as written.",
                )
            content = m["content"]
            if not isinstance(content, str):
                raise fail(
                    f"{col}[{i}].content",
                    f"expected text, got {content!r:.80}",
                    "Give every message its text, or remove the message.",
                )
            if not content.strip():
                raise fail(
                    f"{col}[{i}].content",
                    "the message is empty",
                    "Give every message its text, or remove the message.",
                )
            messages.append({"role": str(m["role"]), "content": content})
        if messages[-1]["role"] == "assistant":
            # the responses are rendered as the next assistant turn: two in a row
            raise fail(
                f"{col}[{len(messages) - 1}]",
                "the prompt ends with an assistant turn",
                "End the prompt with the turn the responses answer; an assistant reply belongs in the responses.",
            )
        return messages
    raise fail(col, f"expected text or chat messages, got {value!r:.80}", fix)


def response_message(value: Any, fail, empty_fix: str) -> dict[str, str]:
    """A response (text, an assistant message, or a conversation ending with one) as one
    assistant message; `fail(what, fix)` names the field already; `empty_fix`: what to do
    about an empty response, which depends on the dataset's layout."""
    reply = "give the reply alone (its text, or {role: assistant, content: ...})"
    if isinstance(value, Mapping):
        if value.get("role", "assistant") != "assistant":
            raise fail(
                f"a response message must have role 'assistant', not {value.get('role')!r}",
                f"A response is the assistant's reply: {reply}.",
            )
        if value.get("tool_calls") and not (isinstance(value.get("content"), str) and value["content"].strip()):
            raise fail(
                "the response is a tool call (tool_calls) with no text; POFE trains on text responses "
                "and does not support tool calls as a response",
                "Give the assistant's text reply, or leave this row out.",
            )
        value = value.get("content")
    elif isinstance(value, (list, tuple)) and value and isinstance(value[-1], Mapping):
        # a whole conversation (TRL's conversational preference rows, the SPPO
        # authors' release): the response is its final, assistant, turn
        role = value[-1].get("role", "assistant")
        if role != "assistant":
            raise fail(
                f"the conversation ends with a {role!r} turn, not the assistant's reply",
                f"End each response conversation with the assistant turn being ranked, or {reply}.",
            )
        return response_message(value[-1], fail, empty_fix)
    if not isinstance(value, str):
        raise fail(
            f"expected text or an assistant message, got {type(value).__name__}",
            "Give each response as text, an assistant message, or a conversation ending with one.",
        )
    if not value.strip():
        raise fail("the response is empty", empty_fix)
    return {"role": "assistant", "content": value}
