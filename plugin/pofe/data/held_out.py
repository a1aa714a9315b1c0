"""Prompts kept from training for `axolotl pofe eval`, when a recipe trains on its own datasets.

An iterated run holds its prompts out itself (`pofe.run.prompts`; its rounds' recipes carry no
`pofe.eval`). A recipe trained by `axolotl preprocess` / `axolotl train` and then evaluated as
one trained model (`pofe.run.evaluation.trained`) holds them out here, in one of two ways:

- `pofe.eval.held_out: n`: the last n rows of its one dataset are never trained on, and
  neither is any other row with one of their prompts (pairs datasets often hold several
  pairs per prompt); the loader counts both (`hold_out`);
- `val_set_size`: axolotl's validation split of the prepared rows; evaluation reads their
  prompts back from the rows' `source_prompt` column (`validation_prompts`), and counts those
  that some training row also has (axolotl splits rows, not prompts).

A prompt is compared as chat messages (`label_checks.prompt_key`), and read as a judge reads
it (`formats.source_prompt`): the prompt column's value, or the prompt a row's responses share.
"""

from __future__ import annotations

import json

from datasets import Dataset

from pofe.data.formats import PofeDataError, RowFormat, row_error, source_prompt
from pofe.data.label_checks import prompt_key
from pofe.data.messages import prompt_messages
from pofe.data.sources import load_entry

# the prepared rows' column holding each row's prompt as a judge reads it (JSON)
SOURCE_PROMPT = "source_prompt"


def held_out_count(pofe, entries: list) -> int:
    """`pofe.eval.held_out` when set above 0 (its default, unset, holds nothing out of a
    recipe's own datasets); a recipe of several datasets cannot say whose last rows."""
    n = (pofe.eval.held_out or 0) if pofe.eval else 0
    if n and len(entries) != 1:
        raise PofeDataError(
            f"pofe.eval.held_out: {n} holds out the last rows of the recipe's one dataset; this recipe has "
            f"{len(entries)}. Name a prompt file with pofe.eval.prompts, or hold out rows with val_set_size."
        )
    return n


def hold_out(raw: Dataset, fmt: RowFormat, n: int) -> tuple[Dataset, Dataset, set[str]]:
    """(rows to train on, the last `n` rows, the held-out rows' prompt keys)."""
    if n >= len(raw):
        raise PofeDataError(
            f"pofe.eval.held_out: {n} would hold out every row of {fmt.dataset} ({len(raw)} rows); lower it."
        )
    cut = len(raw) - n
    held = raw.select(range(cut, len(raw)))
    keys = {prompt_key(_messages(p, fmt, cut + i)) for i, p in enumerate(source_prompts(held, fmt, start=cut))}
    return raw.select(range(cut)), held, keys


def without_prompts(rows: Dataset, fmt: RowFormat, keys: set[str]) -> tuple[Dataset, list[int]]:
    """`rows` less those whose prompt is one of `keys` (`hold_out`'s), and the indices in `rows`
    of those kept (each one's row in its file); for a set of raw rows (an online run's prompts),
    where the loader compares prepared rows."""
    kept = [
        i for i, prompt in enumerate(source_prompts(rows, fmt)) if prompt_key(_messages(prompt, fmt, i)) not in keys
    ]
    return rows.select(kept), kept


def source_prompts(rows: Dataset, fmt: RowFormat, start: int = 0) -> list:
    """Each row's prompt as a judge reads it; `start`: the first row's index in its dataset."""
    return [source_prompt(row, start + i, fmt) for i, row in enumerate(rows)]


def trained_held_out(cfg, pofe) -> tuple[list[dict] | None, str]:
    """(one row per distinct prompt of the rows `pofe.eval.held_out` kept from training, where
    they came from); (None, "") when it is not set. Each row is `{"prompt": its prompt as a judge
    reads it, "columns": the dataset row's other columns}` (a reward function's `answer`)."""
    n = held_out_count(pofe, cfg.datasets)
    if not n:
        return None, ""
    entry = cfg.datasets[0]
    fmt = RowFormat.of_entry(entry, 0, pofe)
    raw = load_entry(entry, cfg.hf_use_auth_token)
    _, held, _ = hold_out(raw, fmt, n)
    rows, seen = [], set()
    prompt_field = fmt.column("field_prompt")
    for i, (row, prompt) in enumerate(zip(held, source_prompts(held, fmt, start=len(raw) - n))):
        key = prompt_key(_messages(prompt, fmt, len(raw) - n + i))
        if key not in seen:
            seen.add(key)
            rows.append({"prompt": prompt, "columns": {c: v for c, v in row.items() if c != prompt_field}})
    return rows, f"the last {n} rows of {entry.path} (pofe.eval.held_out), kept from training"


def validation_prompts(train: Dataset, validation: Dataset) -> tuple[list, int]:
    """(the distinct prompts of the validation rows, in order; how many of them a training row
    has too), from the prepared rows' `source_prompt` column."""
    seen, prompts = set(), []  # the prompts as JSON text (json.dumps, keys sorted)
    for text in validation[SOURCE_PROMPT]:
        if text not in seen:
            seen.add(text)
            prompts.append(json.loads(text))
    trained = set(train[SOURCE_PROMPT])
    return prompts, sum(text in trained for text in seen)


def _messages(prompt, fmt: RowFormat, index: int) -> list[dict]:
    return prompt_messages(prompt, fmt.column("field_prompt"), row_error(fmt.dataset, index))
