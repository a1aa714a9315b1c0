"""The prompt of a row without one: TRL's implicit-prompt preference layout.

Most preference sets on the hub (`trl-lib/ultrafeedback_binarized` among them) have no
prompt column: `chosen` and `rejected` are whole conversations, or whole texts, that begin
with the same turns (or words): the prompt. TRL takes their shared prefix as the prompt
(`trl.data_utils.extract_prompt`); POFE does the same, with TRL's helper, for a pair and
for k responses (the prompt is the shortest of the prefixes each response shares with the
first: the prefix all k share).

What remains of each response must be one response: a single assistant message
(conversations) or text (plain rows). Conversations that part before their last turn would
leave a response of several turns, which POFE does not train: an error, not a cut. Texts
are read this way only as pairs (TRL's standard implicit layout): among k free texts a shared
start is as likely chance as a prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Fail = Callable[[str, str, str], Exception]

FIX = (
    "Give a prompt column (or name it with field_prompt), or whole conversations that begin with the "
    "prompt's turns and end with the response."
)


def implicit_prompt(responses: Sequence[Any], names: list[str], fail: Fail, pair: bool) -> tuple[Any, list[Any]]:
    """(prompt, what remains of each response) for `responses`, which carry the prompt.

    `names` are the responses' fields, for errors; `pair`: they are a pair's chosen and
    rejected columns (texts are read only then). The prompt is chat messages for
    conversations, text for texts; each remainder is one assistant message, or text.
    """
    kinds = [_kind(r) for r in responses]
    for name, kind, value in zip(names, kinds, responses):
        if kind is None:
            raise fail(name, f"no prompt column, and this is neither a conversation nor text (got {value!r:.80})", FIX)
    if len(set(kinds)) > 1:
        raise fail(names[1], f"is {kinds[1]} where {names[0]} is {kinds[0]}", "Give every response in one layout.")
    if kinds[0] == "text" and not pair:
        raise fail(
            names[0],
            "no prompt column, and the responses are texts: a prompt is read from the start of texts only for "
            "pairs (chosen, rejected)",
            FIX,
        )
    # TRL imported here, not with the module: it loads torch._dynamo, whose logging would reach the
    # console of `axolotl pofe run`, which imports this module but never reads a row
    from trl.data_utils import extract_prompt

    # the prefix all share: the shortest of each response's prefix shared with the first
    prompt = min((extract_prompt({"chosen": responses[0], "rejected": r})["prompt"] for r in responses[1:]), key=len)
    # (TRL's rule moves the prompt's end back over a space; at index 0 it would wrap around)
    shared = all(r[: len(prompt)] == prompt for r in responses)
    if not shared or not (prompt.strip() if isinstance(prompt, str) else prompt):
        raise fail(names[1], f"shares no leading {_unit(kinds[0])} with {names[0]}, so there is no prompt", FIX)
    rests = [r[len(prompt) :] for r in responses]
    if kinds[0] == "text":
        return prompt, rests
    for name, rest in zip(names, rests):
        if len(rest) != 1:
            raise fail(
                name,
                f"continues the prompt the responses share with {len(rest)} turns, not one response",
                "Responses of a row must differ only in their last, assistant turn: POFE trains one "
                "assistant response per candidate.",
            )
    return list(prompt), [rest[0] for rest in rests]


def splits_a_word(prompt: str, rests: Sequence[str]) -> bool:
    """Whether a text prompt ends inside a word or number that a response continues: TRL's split
    of "16+11=27" / "16+11=21" is "16+11=2", answered by "7" and "1"."""
    return prompt[-1:].isalnum() and any(rest[:1].isalnum() for rest in rests)


def _kind(value: Any) -> str | None:
    from trl.data_utils import is_conversational

    if isinstance(value, str):
        return "text"
    if isinstance(value, (list, tuple)) and value and is_conversational({"prompt": list(value)}):
        return "a conversation"
    return None


def _unit(kind: str) -> str:
    return "text" if kind == "text" else "turn"
