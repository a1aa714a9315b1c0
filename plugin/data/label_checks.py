"""Label checks across a dataset's rows: suspicious, not impossible, so warned about with a count.

Per-row checks (`formats.py`) refuse what cannot be trained on; these look at rows together,
or at a label order that is legal but rarely meant:

- `conflicting_rows`: the same prompt in two rows ranks the same two responses in opposite
  orders (one row says a > b, the other b > a); training pulls both ways and learns noise.
- `reversed_ucla_rows`: a `pofe.sppo_ucla` row whose chosen response has the lower win rate.
  The SPPO scripts pick chosen as the highest-scored sample and rejected as the lowest, so
  this usually means swapped columns; SPPO trains on the win rates as given, so it is a
  warning, not an error.

Rows are compared by digests of their texts (`text_keys`), so the check keeps no text.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# rows named in a warning, at most
SHOWN = 5


def text_keys(row: dict[str, Any]) -> dict[str, Any]:
    """Digests of a canonical row's prompt and of each response's text."""

    def digest(value: Any) -> str:
        return hashlib.md5(json.dumps(value, sort_keys=True).encode(), usedforsecurity=False).hexdigest()

    return {"prompt_key": digest(row["prompt"]), "response_keys": [digest(r["content"]) for r in row["responses"]]}


def conflicting_rows(
    prompt_keys: list[str], response_keys: list[list[str]], labels: list[list[float]]
) -> list[tuple[int, int]]:
    """(earlier row, later row) for each row whose order of some response pair is the opposite of
    an earlier row's with the same prompt; one pair per later row."""
    seen: dict[tuple[str, str, str], tuple[int, bool]] = {}  # (prompt, a, b) with a < b -> (row, a ranked above b)
    out = []
    for row, (prompt, keys, values) in enumerate(zip(prompt_keys, response_keys, labels)):
        clash = None
        for i in range(len(keys)):
            for j in range(len(keys)):
                if keys[i] >= keys[j] or values[i] == values[j]:
                    continue
                first = seen.setdefault((prompt, keys[i], keys[j]), (row, values[i] > values[j]))
                if first[0] != row and first[1] != (values[i] > values[j]) and clash is None:
                    clash = first[0]
        if clash is not None:
            out.append((clash, row))
    return out


def reversed_ucla_rows(win_rates: list[list[float]]) -> list[int]:
    """Rows of a `pofe.sppo_ucla` dataset (win rates [chosen, rejected]) where chosen's is lower."""
    return [n for n, (chosen, rejected) in enumerate(win_rates) if chosen < rejected]


def shown(items: list) -> str:
    """The first few of `items` for a message, and how many more there are."""
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(str(x) for x in items[:SHOWN]) + more
