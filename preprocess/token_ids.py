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
"""

from __future__ import annotations

from typing import Any

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
