"""Render dataset prompts into the text a policy sees, with the policy's own chat template.

A prompt is what the dataset holds: a plain string or a list of chat messages
({"role", "content"}). Candidates must be generated from exactly the token ids the trainer
will condition on, so rendering uses the policy tokenizer's chat template (with the generation
prompt appended) and tokenises its text as training does (`prompt_token_ids`); backends are
given those ids, never text to tokenise again (a server adding BOS to a template that writes
one would sample after two). A tokenizer without a chat template gets the raw string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Prompt = str | list[dict[str, Any]]


@dataclass(frozen=True)
class Rendered:
    """One rendered prompt: its text and the token ids backends condition on. `text is None`
    means the row was dropped (`reason` says why)."""

    text: str | None
    num_tokens: int
    truncated: bool = False
    reason: str | None = None
    ids: list[int] | None = None


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
    else:
        text = prompt_text(prompt) if not isinstance(prompt, str) else prompt
    ids = prompt_token_ids(tokenizer, text)
    n = len(ids)
    if max_prompt_tokens is None or n <= max_prompt_tokens:
        return Rendered(text, n, ids=ids)
    if overflow == "drop":
        return Rendered(None, n, reason=f"prompt has {n} tokens > max_prompt_tokens={max_prompt_tokens}")
    kept = ids[n - max_prompt_tokens :]
    return Rendered(tokenizer.decode(kept, skip_special_tokens=False), max_prompt_tokens, truncated=True, ids=kept)


def prompt_token_ids(tokenizer, text: str) -> list[int]:
    """The ids of a rendered prompt, as the trainer tokenises it (`pofe.data.tokenize`): a chat
    template writes BOS itself, so no special tokens are added; a raw prompt (no template)
    gets the tokenizer's own (BOS for Llama-style tokenizers)."""
    return tokenizer(text, add_special_tokens=not getattr(tokenizer, "chat_template", None))["input_ids"]
