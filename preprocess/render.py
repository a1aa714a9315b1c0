"""Render dataset prompts into the text a policy sees, with the policy's own chat template.

A prompt is what the dataset holds: a plain string or a list of chat messages
({"role", "content"}). Candidates must be generated from exactly the text the trainer will
condition on, so rendering uses the policy tokenizer's chat template (with the generation
prompt appended). A tokenizer without a chat template gets the raw string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Prompt = str | list[dict[str, Any]]


@dataclass(frozen=True)
class Rendered:
    """One rendered prompt. `text is None` means the row was dropped (`reason` says why)."""

    text: str | None
    num_tokens: int
    truncated: bool = False
    reason: str | None = None


def as_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """A string prompt becomes one user turn; a message list is checked and returned."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        return prompt
    raise TypeError(
        f"prompt must be a string or a list of {{'role','content'}} messages, got {type(prompt).__name__}: "
        f"{str(prompt)[:80]!r}"
    )


def prompt_text(prompt: Prompt) -> str:
    """Plain text of a prompt, for judges that take strings (the last user turn's content)."""
    if isinstance(prompt, str):
        return prompt
    msgs = as_messages(prompt)
    users = [m["content"] for m in msgs if m["role"] == "user"]
    return users[-1] if users else msgs[-1]["content"]


def render_prompt(
    tokenizer,
    prompt: Prompt,
    *,
    max_prompt_tokens: int | None = None,
    overflow: str = "drop",
) -> Rendered:
    """Render one prompt; enforce `max_prompt_tokens` by dropping or keeping the last tokens.

    Truncation keeps the END of the prompt: the generation prompt (assistant header) and the
    latest user turn are what the model must see to answer.
    """
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(as_messages(prompt), tokenize=False, add_generation_prompt=True)
        add_special = False  # the template writes BOS itself
    else:
        text = prompt_text(prompt) if not isinstance(prompt, str) else prompt
        add_special = True
    ids = tokenizer(text, add_special_tokens=add_special)["input_ids"]
    n = len(ids)
    if max_prompt_tokens is None or n <= max_prompt_tokens:
        return Rendered(text, n)
    if overflow == "drop":
        return Rendered(None, n, reason=f"prompt has {n} tokens > max_prompt_tokens={max_prompt_tokens}")
    kept = ids[n - max_prompt_tokens :]
    return Rendered(tokenizer.decode(kept, skip_special_tokens=False), max_prompt_tokens, truncated=True)
