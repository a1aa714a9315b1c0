"""The length policy's cuts, as pure functions on messages and ids (`tokenize.py` applies them).

A row longer than `sequence_len` under `pofe.truncation: truncate` is cut so that what trains is
still a well-formed conversation and no cut response passes for a finished one:

- the prompt loses whole turns from the left (`fit_turns`): leading system messages stay, and
  the kept part starts at a user turn, so the template still writes its BOS, system prefix and
  role tokens. A prompt whose last user turn alone does not fit `max_prompt_len` is dropped
  (`prompt_too_long`): cutting into a turn's text would train on a question with its start
  missing and no role token (bad case 3 of issue 20).
- a response longer than the room left keeps the first tokens of its content and loses the
  template's end of turn (`cut_response`), as TRL's `max_completion_length` cuts a completion:
  the model is trained on the prefix it sampled, never taught to stop where the cut fell.
- a row whose cut responses became identical where their full ids differed is dropped
  (`cut_collision`): its labels ranked texts training can no longer tell apart
  (`cut_conflicting_labels` when they differ, `cut_identical` when equal).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# drop reasons a row of the length policy can carry (summary: `loader.length_policy_summary`)
TOO_LONG = "too_long"  # pofe.truncation: drop
PROMPT_TOO_LONG = "prompt_too_long"
CUT_CONFLICTING_LABELS = "cut_conflicting_labels"
CUT_IDENTICAL = "cut_identical"


def fit_turns(
    messages: list[dict[str, Any]], num_tokens: Callable[[list[dict[str, Any]]], int], max_tokens: int
) -> tuple[list[dict[str, Any]] | None, int]:
    """The longest suffix of whole turns (leading system messages kept, starting at a user turn)
    whose rendered prompt has at most `max_tokens` tokens, and how many messages were cut;
    (None, 0) when even the last user turn does not fit."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    system, rest = messages[:head], messages[head:]
    for start in range(1, len(rest)):
        if rest[start]["role"] == "user" and num_tokens(system + rest[start:]) <= max_tokens:
            return system + rest[start:], start
    return None, 0


def cut_response(ids: Sequence[int], end_of_turn: Sequence[int], room: int) -> list[int]:
    """The first `room` ids of a response's content, without the template's end of turn (so a
    response that lost even part of its end is not trained as finished)."""
    ids, end = list(ids), list(end_of_turn)
    content = ids[: len(ids) - len(end)] if end and ids[len(ids) - len(end) :] == end else ids
    return content[:room]


def cut_collision(full: list[list[int]], cut: list[list[int]], labels: list[list[float]]) -> str | None:
    """Why a row whose responses were cut must be dropped, or None: two responses whose full ids
    differ became identical (`labels`: each label column's values per candidate)."""
    reason = None
    for i in range(len(cut)):
        for j in range(i + 1, len(cut)):
            if cut[i] == cut[j] and full[i] != full[j]:
                if any(column[i] != column[j] for column in labels):
                    return CUT_CONFLICTING_LABELS
                reason = CUT_IDENTICAL
    return reason


def entry_summary(path: str, policy: dict[str, list]) -> dict[str, Any]:
    """What the length policy did to one dataset entry, with a record per row it touched
    (`policy`: the tokenised rows' `truncated`, `drop_reason`, `turns_cut` and `responses_cut`
    columns; rows are the entry's, 0-based)."""
    touched = [n for n, over in enumerate(policy["truncated"]) if over]
    reasons = [policy["drop_reason"][n] for n in touched if policy["drop_reason"][n] is not None]
    return {
        "dataset": path,
        "rows": len(policy["truncated"]),
        "rows_over_sequence_len": len(touched),
        "rows_dropped": {reason: reasons.count(reason) for reason in sorted(set(reasons))},
        "rows_with_turns_cut": sum(policy["turns_cut"][n] > 0 and policy["drop_reason"][n] is None for n in touched),
        "rows_with_responses_cut": sum(
            policy["responses_cut"][n] > 0 and policy["drop_reason"][n] is None for n in touched
        ),
        "per_row": [
            {
                "row": n,
                "dropped": policy["drop_reason"][n],
                "turns_cut": policy["turns_cut"][n],
                "responses_cut": policy["responses_cut"][n],
            }
            for n in touched
        ],
    }


def summary_message(entry: dict[str, Any], sequence_len: int, truncation: str) -> str:
    """One log line for `entry_summary`'s counts."""
    dropped = sum(entry["rows_dropped"].values())
    if truncation == "drop":
        return (
            f"POFE: dropped {dropped} of {entry['rows']} rows of {entry['dataset']} longer than "
            f"sequence_len={sequence_len} (pofe.truncation: drop)"
        )
    reasons = ", ".join(f"{k} {v}" for k, v in entry["rows_dropped"].items()) or "none"
    return (
        f"POFE: {entry['rows_over_sequence_len']} of {entry['rows']} rows of {entry['dataset']} are longer than "
        f"sequence_len={sequence_len} (pofe.truncation: truncate): {entry['rows_with_turns_cut']} kept with "
        f"their oldest prompt turns cut, {entry['rows_with_responses_cut']} with responses cut (trained "
        f"without an end of turn); dropped {dropped} ({reasons})"
    )


def no_rows_message(policy: list[dict[str, Any]], sequence_len: int, max_prompt_len: int, truncation: str) -> str:
    """Why no row is left to train on, from each entry's `entry_summary`, and the key that fixes
    it (the advice to set `truncation: truncate` only where it is not set)."""
    counts: dict[str, int] = {}
    for entry in policy:
        for reason, n in entry["rows_dropped"].items():
            counts[reason] = counts.get(reason, 0) + n
    rows = sum(entry["rows"] for entry in policy)
    if not counts:
        return f"no rows left to train on: none of the {rows} rows read was dropped by the length policy"
    why = f"no rows left to train on: {sum(counts.values())} of {rows} rows dropped by the length policy ({counts})"
    if truncation == "drop":
        return f"{why}: longer than sequence_len={sequence_len}. Raise sequence_len, or set pofe.truncation: truncate"
    fixes = []
    if counts.get(PROMPT_TOO_LONG):
        fixes.append(
            f"{PROMPT_TOO_LONG}: a prompt's last user turn alone is longer than pofe.max_prompt_len={max_prompt_len} "
            "tokens; raise pofe.max_prompt_len (default sequence_len // 2) or sequence_len"
        )
    if counts.get(CUT_IDENTICAL) or counts.get(CUT_CONFLICTING_LABELS):
        fixes.append(
            f"{CUT_IDENTICAL} / {CUT_CONFLICTING_LABELS}: responses cut to fit sequence_len={sequence_len} became "
            "the same tokens; raise sequence_len or lower pofe.max_prompt_len"
        )
    return f"{why}. " + ("; ".join(fixes) or "Raise sequence_len")


def generation_fit_warning(
    sequence_len: int,
    max_new_tokens: int,
    max_prompt_len: int | None,
    max_prompt_tokens: int | None = None,
    truncation: str = "truncate",
) -> str | None:
    """Why candidates of up to `max_new_tokens` new tokens may not train whole under
    `sequence_len`, or None when they do. A row is cut only when its prompt and longest response
    overflow `sequence_len`; its prompt is then cut to `max_prompt_len` (default sequence_len // 2),
    so a response trains whole when it fits the room left by the longest prompt that can reach
    training: `max_prompt_len`, or the generation's `max_prompt_tokens` when lower. (The
    template's end of turn, a token or two, comes on top: a candidate cut at max_new_tokens by
    generation has no end of its own to lose.) A warning, not a refusal: cutting long candidates
    to fit is a choice (the SPPO authors sample up to 2048 new tokens and train at max_length
    1024), which `pofe.truncation` already counts."""
    prompt = max_prompt_len or sequence_len // 2
    if max_prompt_tokens is not None:
        prompt = min(prompt, max_prompt_tokens)
    room = sequence_len - prompt
    if max_new_tokens <= room:
        return None
    fate = (
        "trained cut to fit (pofe.truncation: truncate)"
        if truncation == "truncate"
        else "dropped (pofe.truncation: drop)"
    )
    return (
        f"pofe.generate.max_new_tokens ({max_new_tokens}) does not fit sequence_len ({sequence_len}) after a "
        f"prompt of up to {prompt} tokens (pofe.max_prompt_len, default sequence_len // 2, or "
        f"pofe.generate.max_prompt_tokens): a candidate longer than {room} tokens is judged whole but "
        f"{fate}. Lower max_new_tokens to {room} or less (less the end-of-turn tokens), or raise sequence_len "
        f"to {prompt + max_new_tokens} or more"
    )
