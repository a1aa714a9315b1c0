"""Render dataset prompts into the text a policy sees, with the policy's own chat template.

A prompt is what the dataset holds: a plain string or a list of chat messages
({"role", "content"}). Candidates must be generated from exactly the token ids the trainer
will condition on, so rendering uses the policy tokenizer's chat template (with the generation
prompt appended) and tokenises its text as training does (`prompt_token_ids`); backends are
given those ids, never text to tokenise again (a server adding BOS to a template that writes
one would sample after two). A tokenizer without a chat template gets the raw string.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from pofe.errors import PofeError
from pofe.length_policy import fit_turns

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
    # the turns kept when the prompt's oldest were cut to fit max_prompt_tokens
    messages: list[dict[str, Any]] | None = None


class ChatTemplateError(PofeError, ValueError):
    """The chat template raised while rendering one part of a row: `field`, "prompt" or
    "responses", of row `row` when the renderer knows it (the dataset's loader names the
    dataset, row and column)."""

    def __init__(self, field: str, message: str, row: int | None = None):
        at = "" if row is None else f" of row {row}"
        super().__init__(f"the chat template raised while rendering the {field}{at}: {message}")
        self.field, self.message, self.row = field, message, row


@contextmanager
def template_errors(field: str, row: int | None = None) -> Iterator[None]:
    """Jinja's errors from the template (`raise_exception(...)` included) as ChatTemplateError."""
    try:
        yield
    except TemplateError as e:
        raise ChatTemplateError(field, str(e), row) from e


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
    """Render one prompt; enforce `max_prompt_tokens` by dropping it or cutting its oldest turns.

    Truncation cuts whole turns from the left (`pofe.length_policy.fit_turns`: system
    messages stay, the kept part starts at a user turn), so the latest user turn and the
    generation prompt are what the model sees, under their role tokens; `messages` then holds the
    turns kept, which the candidates' rows carry so training conditions on the same prompt. A
    prompt whose last user turn alone is too long (or a raw prompt, without a chat template) is
    dropped: cutting into its text would leave a question without its start or role token.
    """
    templated = bool(getattr(tokenizer, "chat_template", None))
    text = _text(tokenizer, prompt)
    ids = prompt_token_ids(tokenizer, text)
    n = len(ids)
    if max_prompt_tokens is None or n <= max_prompt_tokens:
        return Rendered(text, n, ids=ids)
    kept = None
    if overflow == "truncate" and templated:
        kept, _ = fit_turns(
            as_messages(prompt), lambda m: len(prompt_token_ids(tokenizer, _text(tokenizer, m))), max_prompt_tokens
        )
    if kept is None:
        why = "" if overflow == "drop" else " (its last user turn alone does not fit)"
        return Rendered(None, n, reason=f"prompt has {n} tokens > max_prompt_tokens={max_prompt_tokens}{why}")
    text = _text(tokenizer, kept)
    ids = prompt_token_ids(tokenizer, text)
    return Rendered(text, len(ids), truncated=True, ids=ids, messages=kept)


def _text(tokenizer, prompt: Prompt) -> str:
    if getattr(tokenizer, "chat_template", None):
        with template_errors("prompt"):
            return tokenizer.apply_chat_template(as_messages(prompt), tokenize=False, add_generation_prompt=True)
    return prompt_text(prompt) if not isinstance(prompt, str) else prompt


def text_prompt(tokenizer, prompt: str) -> str:
    """A prompt trained as text (no chat template, `pofe.data.tokenize.text_token_ids`) written so
    that `prompt_token_ids` gives the ids training conditioned on, `tokenizer(prompt)` with its
    special tokens: with a chat template `prompt_token_ids` adds none, so the ones the tokenizer
    puts first (BOS) are written out."""
    if not getattr(tokenizer, "chat_template", None):
        return prompt
    ids, plain = tokenizer(prompt)["input_ids"], tokenizer(prompt, add_special_tokens=False)["input_ids"]
    first = len(ids) - len(plain)
    return (tokenizer.decode(ids[:first]) if first > 0 and ids[first:] == plain else "") + prompt


def prompt_token_ids(tokenizer, text: str) -> list[int]:
    """The ids of a rendered prompt, as the trainer tokenises it (`pofe.data.tokenize`): a chat
    template writes BOS itself, so no special tokens are added; a raw prompt (no template)
    gets the tokenizer's own (BOS for Llama-style tokenizers)."""
    return tokenizer(text, add_special_tokens=not getattr(tokenizer, "chat_template", None))["input_ids"]
