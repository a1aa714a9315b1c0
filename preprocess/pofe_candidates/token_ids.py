"""The ids training scores for a sampled response: what the policy sampled, then the chat
template's end of turn.

A backend returns each candidate's sampled ids (`Completion.token_ids`). Training used to
tokenise each response's text again, alone; with BPE and sentencepiece tokenizers those ids
can differ from the sampled ones (a leading space, merges across the prompt/response
boundary), and the trained log-probs would then not be those of the sampled tokens. So a
candidate with sampled ids trains on `content_ids + end_of_turn_ids`:

- `content_ids`: the sampled ids less the stop token that ended the candidate (the ids its
  text decodes from);
- `end_of_turn_ids`: the ids the chat template writes after an assistant turn's content
  (`<|im_end|>\\n`, `<|eot_id|>`, `</s>`), as training has always appended and scored them (so the
  model learns to end its turn the template's way). A sampled stop token that is the
  template's end of turn is thus trained as sampled.

A template that writes no special token after a turn (a base model's `role: content` template)
gives the model nothing to stop on; `turn_end` then appends `eos_token`, as TRL's DPOTrainer
appends it to each completion of a dataset it renders without a chat template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pofe.errors import PofeError

# A content the chat template passes through unchanged (no leading or trailing space to trim)
SENTINEL = "POFE0SENTINEL0CONTENT"


def response_text(tokenizer, messages: list[dict[str, Any]], prompt: str, content: str) -> str:
    """The text the chat template adds after the rendered `prompt` for one assistant turn of
    `content` (its end-of-turn tokens included)."""
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": content}], tokenize=False)
    if not full.startswith(prompt):
        raise ValueError(
            "the chat template does not render a conversation as the generation "
            "prompt followed by the assistant turn, so response tokens cannot be "
            "told apart; set `chat_template:` to a template that does (e.g. chatml)"
        )
    return full[len(prompt) :]


def end_of_turn_ids(tokenizer, messages: list[dict[str, Any]], prompt: str) -> list[int]:
    """The ids the chat template writes after an assistant turn's content (tokenised alone:
    real templates end a turn with a special token, which no merge crosses)."""
    turn = response_text(tokenizer, messages, prompt, SENTINEL)
    at = turn.rfind(SENTINEL)
    if at < 0:
        raise ValueError(
            "the chat template does not write the assistant's content as given; POFE cannot tell "
            "where a response ends and the template's end of turn begins"
        )
    return tokenizer(turn[at + len(SENTINEL) :], add_special_tokens=False)["input_ids"]


class NoStopTokenError(PofeError, ValueError):
    """Neither the chat template nor the tokenizer gives a token a trained response can end on."""


@dataclass(frozen=True)
class TurnEnd:
    """How a trained response ends: `template`, the ids the chat template writes after an
    assistant turn's content; `stop`, the id among them generation stops on (the template's
    first special token, or `eos_token_id` when `eos_appended`: the template writes none, so
    eos_token follows its end of turn)."""

    template: list[int]
    stop: int
    eos_appended: bool

    @property
    def ids(self) -> list[int]:
        """Everything a finished response ends with."""
        return [*self.template, self.stop] if self.eos_appended else self.template

    def finish(self, ids: list[int], written: bool = False) -> tuple[list[int], bool]:
        """`ids` ended as training scores them, and whether eos_token was appended to them.

        `written`: the ids are a response's text tokenised with the template's end of turn
        (`retokenized_ids`); else its content alone (sampled ids, `content_ids`). Content that
        already ends with the stop token (a backend that left it on, a text ending in eos_token)
        keeps it and gets only what the template writes after it: one stop token, never two.
        """
        n = len(self.template)
        if written:
            if ids[len(ids) - n :] != self.template:  # the content's last token merged with the template's end
                add = self.eos_appended and ids[-1:] != [self.stop]
                return ids + [self.stop] * add, add
            ids = ids[: len(ids) - n]
        if ids[-1:] == [self.stop]:
            return ids + self.ids[self.ids.index(self.stop) + 1 :], False
        return ids + self.ids, self.eos_appended


def turn_end(tokenizer, messages: list[dict[str, Any]], prompt: str) -> TurnEnd:
    """How a response to `messages` (rendered as `prompt`) ends in training, so the model learns
    to stop: the template's end of turn when it writes a special token there (`<|im_end|>`,
    `<|eot_id|>`, `</s>`); else that followed by eos_token. Raises NoStopTokenError when the
    tokenizer has no eos_token either."""
    end = end_of_turn_ids(tokenizer, messages, prompt)
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    marker = next((i for i in end if i in special), None)
    if marker is not None:
        return TurnEnd(end, marker, eos_appended=False)
    if tokenizer.eos_token_id is None:
        raise NoStopTokenError(
            f"the tokenizer of {tokenizer.name_or_path} has no eos_token and its chat template writes no special "
            f"token after an assistant turn (only {tokenizer.decode(end)!r}), so a trained response has no token "
            "to end on and the model would never learn to stop. Set the token the model ends a response with in "
            "the recipe (`special_tokens: {eos_token: ...}`), or a `chat_template:` that ends each turn with a "
            "special token (e.g. chatml)"
        )
    return TurnEnd(end, tokenizer.eos_token_id, eos_appended=True)


def content_ids(sampled: list[int], finish_reason: str | None, tokenizer) -> list[int]:
    """The sampled ids without the stop token that ended them ("stop": the last id, when it is
    a special token; a stop string leaves the ids as they are)."""
    if finish_reason == "stop" and sampled and sampled[-1] in set(tokenizer.all_special_ids):
        return list(sampled[:-1])
    return list(sampled)


def retokenized_ids(tokenizer, messages: list[dict[str, Any]], prompt: str, text: str) -> list[int]:
    """A response's ids as training tokenises its text when it has no sampled ids (a dataset's
    own responses, rows of user datasets, backends that return no ids)."""
    return tokenizer(response_text(tokenizer, messages, prompt, text), add_special_tokens=False)["input_ids"]
