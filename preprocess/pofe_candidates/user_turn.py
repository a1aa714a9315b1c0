"""A sampled response that runs on into a user turn it wrote itself, cut where that turn begins.

A policy that skips its end-of-turn token may write the chat template's user header
(`<|im_start|>user`, Llama 3's `<|start_header_id|>user<|end_header_id|>`), a user's text and an
answer to it, then stop. The assistant's turn ended where the header began, so POFE cuts the
response there, as vLLM does at a stop string (the text before it, finish reason "stop"): judge
and trainer see the assistant's answer alone, and training appends the template's end of turn,
so the policy learns to end its turn where it wrote a user's. Cutting rather than flagging: a
flagged sample would still be judged on a conversation the user never had.

The header is found the same way for every template: render a conversation with a user turn
after the assistant's, and take what the template writes between the two contents, less the
assistant's end of turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from os.path import commonprefix

from jinja2 import TemplateError

# a user's and an assistant's content the template passes through unchanged (no space to trim)
CONTENT, ASSISTANT = "POFE0USER0CONTENT", "POFE0ASSISTANT0CONTENT"


@dataclass(frozen=True)
class UserTurn:
    """The text that opens a user turn (`header`, surrounding whitespace trimmed), and whether it
    holds a special token: then it is found anywhere in a response; a plain-text header (Mistral
    v0.1's "[INST]", "### Instruction:") only at the response's start or after whitespace, so a
    word that merely ends with it ("the_user:") stays."""

    header: str
    special: bool

    def find(self, text: str) -> int | None:
        """Where in `text` the first user turn begins, or None."""
        at = text.find(self.header)
        while at > 0 and not self.special and not text[at - 1].isspace():
            at = text.find(self.header, at + 1)
        return None if at < 0 else at


def user_turn(tokenizer) -> UserTurn | None:
    """What opens a user turn after an assistant's under `tokenizer`'s chat template: what the
    template writes between an assistant's content and a next user's, less the assistant's end of
    turn (what it writes after that content when the turn is last) and a leading bos_token (a
    template that writes one per turn does so after the end of turn, which stops generation
    anyway). Read between the two contents, not as what the longer conversation adds to the
    shorter: a template may render the last assistant turn otherwise (Qwen3 writes an empty
    `<think>` block into it only). None when the tokenizer has no template, or the template
    cannot render a user turn after an assistant's (then nothing is cut)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": ASSISTANT}]
    try:
        last = tokenizer.apply_chat_template(turns, tokenize=False)
        longer = tokenizer.apply_chat_template([*turns, {"role": "user", "content": CONTENT}], tokenize=False)
    except TemplateError:
        return None
    at, end = longer.find(ASSISTANT), last.rfind(ASSISTANT)
    if at < 0 or end < 0 or CONTENT not in longer[at:]:
        return None
    between = longer[at + len(ASSISTANT) : longer.index(CONTENT, at)]
    header = between[len(commonprefix([between, last[end + len(ASSISTANT) :]])) :].strip()
    if tokenizer.bos_token and header.startswith(tokenizer.bos_token):
        header = header[len(tokenizer.bos_token) :].strip()
    if not header:
        return None
    special = set(tokenizer.all_special_tokens) | {
        t.content for t in tokenizer.added_tokens_decoder.values() if t.special
    }
    return UserTurn(header, any(t in header for t in special if t))


def cut_at_user_turn(
    text: str, ids: list[int] | None, turn: UserTurn, tokenizer
) -> tuple[str, list[int] | None] | None:
    """A response (`text`, and `ids`: its sampled ids less the stop token, or None) cut before the
    first user turn it writes, or None when it writes none.

    With ids, the ids decide (backends decode the text without special tokens, so a header such as
    `<|im_start|>user` leaves only "user" in the text): the cut keeps the ids before the token the
    header starts in, and the text is their decoding, as the backends decode."""
    if ids is None:
        at = turn.find(text)
        return None if at is None else (text[:at], None)
    at = turn.find(tokenizer.decode(ids, skip_special_tokens=False))
    if at is None:
        return None
    keep = 0  # the most ids whose decoding ends at or before the header
    while len(tokenizer.decode(ids[: keep + 1], skip_special_tokens=False)) <= at:
        keep += 1
    return tokenizer.decode(ids[:keep], skip_special_tokens=True), list(ids[:keep])


def cut_user_turns(
    texts: list[str], finish: list[str | None], ids: list[list[int] | None], first: int, turn: UserTurn, tokenizer
) -> int:
    """Cut, in place, the candidates from `first` on (the policy's samples; dataset responses are
    the dataset's) that run on into a user turn: each ended its turn there (finish reason "stop",
    where the backend gave one). Returns how many were cut."""
    cut = 0
    for k in range(first, len(texts)):
        done = cut_at_user_turn(texts[k], ids[k], turn, tokenizer)
        if done is not None:
            texts[k], ids[k] = done
            finish[k] = None if finish[k] is None else "stop"
            cut += 1
    return cut
