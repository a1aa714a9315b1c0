"""Render canonical rows with the chat template and tokenise prompt and responses.

The prompt is rendered with `add_generation_prompt=True`; each response is the text the
template adds after it for one assistant turn (so the end-of-turn tokens are scored,
and the model learns to stop). Prompt and responses are tokenised apart, so the
collator can lay out each candidate as `prompt_ids + response_ids[j]` and score only
response tokens. A response the policy sampled (rows of the candidate pipeline carry
`response_ids`) is scored on its sampled ids plus the template's end of turn, not its
text tokenised again (`pofe.preprocess.token_ids` says why).
"""

from __future__ import annotations

from typing import Any, Literal

from pofe.preprocess.token_ids import end_of_turn_ids, response_text

from ..layout import candidate_float_columns


def render_row(row: dict[str, Any], tokenizer) -> tuple[str, list[str]]:
    """Return the rendered prompt text and each response's text after it."""
    prompt = tokenizer.apply_chat_template(
        row["prompt"], tokenize=False, add_generation_prompt=True
    )
    return prompt, [response_text(tokenizer, row["prompt"], prompt, m["content"]) for m in row["responses"]]


def response_token_ids(row: dict[str, Any], tokenizer, prompt: str, texts: list[str]) -> list[list[int]]:
    """Each response's ids: its sampled ids and the template's end of turn when the row has
    them (`response_ids`, from the candidate pipeline), else its text tokenised alone."""
    sampled = row.get("response_ids") or [None] * len(texts)
    end = end_of_turn_ids(tokenizer, row["prompt"], prompt) if any(ids is not None for ids in sampled) else []
    return [
        tokenizer(text, add_special_tokens=False)["input_ids"] if ids is None else list(ids) + end
        for text, ids in zip(texts, sampled, strict=True)
    ]


def tokenize_row(
    row: dict[str, Any],
    tokenizer,
    *,
    sequence_len: int,
    max_prompt_len: int,
    truncation: Literal["truncate", "drop"],
) -> dict[str, Any]:
    """Tokenise one canonical row; returns ids plus `truncated` / `keep` flags.

    Policy when `len(prompt) + max_j len(response_j) > sequence_len`:
    `truncate` keeps the last `max_prompt_len` prompt tokens (the question usually
    sits at the end of a long prompt), then cuts each response to the room left;
    `drop` marks the row `keep=False` (the caller filters and counts).
    """
    prompt_text, response_texts = render_row(row, tokenizer)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    response_ids = response_token_ids(row, tokenizer, prompt_text, response_texts)
    too_long = len(prompt_ids) + max(len(r) for r in response_ids) > sequence_len
    keep = not (too_long and truncation == "drop")
    if too_long and truncation == "truncate":
        prompt_ids = prompt_ids[-max_prompt_len:]
        room = sequence_len - len(prompt_ids)
        response_ids = [r[:room] for r in response_ids]
    out = {
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "truncated": too_long,
        "keep": keep,
    }
    for key in candidate_float_columns():
        if key in row:
            out[key] = row[key]
    return out
