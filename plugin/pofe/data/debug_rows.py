"""`axolotl preprocess --debug` (and `train --debug`) on POFE rows: a few tokenised rows shown
as axolotl shows its own.

Axolotl prints an SFT row as its tokens, each coloured by its label (red: not trained, -100;
green: trained) with `(label, id)` beside it (`axolotl.utils.tokenization.check_example_labels`).
POFE's rows are a prompt and k candidates, so each candidate is shown that way as the row the
trainer scores, `prompt_ids + response_ids[j]`: the prompt's tokens masked, the candidate's
trained, after a line with the row's labels (rewards or win rates). Before them, for an entry
without a prompt column, its first rows as the implicit prompt splits them (`show_splits`):
the prompt, each response, and whether the row trains as text or in the chat template.

Axolotl's `--debug` flags reach a plugin only in the raw config (its schema drops them):
`PofePlugin.register` reads them with `debug_request`.
"""

from __future__ import annotations

from typing import Any

from pofe.columns import AS_TEXT, IGNORE_INDEX, SPLIT_IN_WORD
from pofe.logs import get_logger
from pofe.methods import method_spec

LOG = get_logger(__name__)


def debug_request(cfg: dict[str, Any]) -> tuple[int, bool]:
    """(rows to show, tokens as text only) from axolotl's `--debug`, `--debug-num-examples N`
    and `--debug-text-only` in the raw config; (0, False) when none is set. `--debug` alone
    shows one row, as axolotl's preprocess does."""
    count = int(cfg.get("debug_num_examples") or 0)
    asked = bool(cfg.get("debug") or cfg.get("debug_text_only") or count > 0)
    return (max(count, 1) if asked else 0), bool(cfg.get("debug_text_only"))


def show_rows(dataset, tokenizer, method: str, count: int, text_only: bool = False) -> list[str]:
    """Log the first `count` rows of a tokenised POFE dataset; returns the coloured lines."""
    from axolotl.utils.tokenization import check_example_labels

    target = method_spec(method).target
    shown = []
    for i in range(min(count, len(dataset))):
        row = dataset[i]
        prompt, responses, labels = row["prompt_ids"], row["response_ids"], row[target.column]
        LOG.info(
            f"POFE row {i}: prompt {len(prompt)} tokens (not trained), {len(responses)} candidates; "
            f"{target.noun}: {[round(x, 4) for x in labels]}"
        )
        LOG.info(f"prompt: {tokenizer.decode(prompt)!r}")
        for j, (ids, label) in enumerate(zip(responses, labels, strict=True)):
            LOG.info(f"candidate {j} ({target.noun[:-1]} {label:.4g}), {len(ids)} trained tokens:")
            example = {"input_ids": list(prompt) + list(ids), "labels": [IGNORE_INDEX] * len(prompt) + list(ids)}
            shown.append(check_example_labels(example, tokenizer, text_only=text_only))
    return shown


def show_splits(cfg, pofe, count: int) -> list[str]:
    """Log how the first `count` rows of each entry without a prompt column are split into a
    prompt and responses (TRL's implicit prompt, `pofe.data.implicit_prompt`); returns the lines."""
    from pofe.data.formats import RowFormat, normalize_row
    from pofe.data.sources import load_entry

    lines = []
    for i, entry in enumerate(cfg.datasets):
        fmt = RowFormat.of_entry(entry, i, pofe)
        if entry.type == "pofe.prompts" or fmt.prompt_format == "hh":
            continue
        raw = load_entry(entry, cfg.hf_use_auth_token)
        if fmt.column("field_prompt") in raw.column_names:
            continue
        for index in range(min(count, len(raw))):
            row = normalize_row(raw[index], index, fmt)
            how = "as text, no chat template" if row[AS_TEXT] else "in the chat template"
            prompt = row["source_prompt"]
            lines.append(
                f"POFE {entry.path} row {index}, trained {how}: implicit prompt (the responses' shared start) "
                f"{prompt!r}"
                + (" ENDS INSIDE A WORD OR NUMBER" if row[SPLIT_IN_WORD] else "")
                + "; responses "
                + ", ".join(repr(m["content"]) for m in row["responses"])
            )
            LOG.info(lines[-1])
    return lines
