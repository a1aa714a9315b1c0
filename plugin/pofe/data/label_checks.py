"""Label checks: within a row, what cannot be trained on; across rows, what is suspicious.

Within a row (`check_labels`, called by `pofe.data.formats` on each row), an error naming
the row and field: a label outside its target's range, one text with two labels, labels that
differ but tie in float32 (training's precision); rewards and ranks given together that order
two responses oppositely (`check_labels_agree`: the ranks would be ignored). Each label value
is checked as it is read (`label_number`, `label_numbers`, `label_log_probs`): a number,
finite, and finite in float32.

Across rows, suspicious but not impossible, so warned about with a count:

- `conflicting_rows`: the same prompt in two rows ranks the same two responses in opposite
  orders (one row says a > b, the other b > a); training pulls both ways and learns noise.
- `reversed_pair_rows`: a pair whose chosen response has the lower label: a `pofe.sppo_ucla`
  row's win rate (the SPPO scripts pick chosen as the highest-scored sample and rejected as
  the lowest), or a `pofe.pairs` row's score (TRL's `score_chosen` / `score_rejected`). That
  usually means swapped columns; training takes the labels as given, so it is a warning.

Rows are compared by digests of their texts (`text_keys`), so the check keeps no text.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pofe.files import stable_hash
from pofe.methods import Target

# rows named in a warning, at most
SHOWN = 5


def prompt_key(messages: list[dict]) -> str:
    """The digest a prompt (as chat messages) is compared by."""
    return stable_hash(messages, 32)


def text_keys(row: dict[str, Any]) -> dict[str, Any]:
    """Digests of a canonical row's prompt and of each response's text."""

    return {
        "prompt_key": prompt_key(row["prompt"]),
        "response_keys": [stable_hash(r["content"], 32) for r in row["responses"]],
    }


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


def reversed_pair_rows(labels: list[list[float]]) -> list[int]:
    """Rows of pairs (labels [chosen, rejected]) where chosen's label is the lower."""
    return [n for n, (chosen, rejected) in enumerate(labels) if chosen < rejected]


def shown(items: list) -> str:
    """The first few of `items` for a message, and how many more there are."""
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(str(x) for x in items[:SHOWN]) + more


def check_labels(
    target: Target, labels: list[float], label_names: list[str], responses: list[dict], names: list[str], fail
) -> None:
    """The target's rules: its range, one label per distinct text, float32-distinct labels.
    `label_names` / `names`: each label's / response's field, for errors."""
    if target.bounds is not None:
        low, high = target.bounds
        for name, value in zip(label_names, labels):
            if not low <= value <= high:
                raise fail(
                    name,
                    f"{target.noun[:-1]} {value} is outside [{low:g}, {high:g}]",
                    f"{target.noun.capitalize()} are probabilities; recompute them."
                    if (low, high) == (0.0, 1.0)
                    else "Rescale or fix this row's labels.",
                )
    check_duplicates(responses, labels, names, target.noun, fail)
    if target.distinct_in_float32:
        check_float32_ties(labels, names, fail)


def check_duplicates(responses: list[dict], labels: list[float], names: list[str], label: str, fail) -> None:
    """The same text cannot be both better and worse than itself."""
    first: dict[str, int] = {}
    for j, message in enumerate(responses):
        i = first.setdefault(message["content"], j)
        if labels[i] != labels[j]:
            raise fail(
                names[j],
                f"the same text as {names[i]} but {label} {labels[j]} vs {labels[i]}",
                "Remove the duplicate, or give both the same value.",
            )


def check_float32_ties(rewards: list[float], names: list[str], fail) -> None:
    """Rewards that differ but round to one float32 would silently tie in training.
    Differences at float64's own rounding level (0.1 + 0.2 vs 0.3) are arithmetic noise,
    not a ranking, and pass."""
    as32 = np.asarray(rewards, dtype=np.float32)
    for j in range(len(rewards)):
        for i in range(j):
            a, b = rewards[i], rewards[j]
            if as32[i] == as32[j] and abs(a - b) > 1e-12 * max(abs(a), abs(b)):
                raise fail(
                    names[j],
                    f"reward {b!r} differs from {names[i]}'s {a!r} but both "
                    f"are {float(as32[j])!r} in float32 (training's precision), so they tie",
                    "Shift or rescale this row's rewards (e.g. subtract the row's "
                    "mean) so their differences survive float32.",
                )


def check_labels_agree(
    trained: list[float], trained_col: str, other: list[float], other_col: str, fail, *, ranks: bool, drop: str
) -> None:
    """A row with a second label column beside the one trained on (rewards and ranks in an RRHF row;
    win rates and rewards or ranks in an SPPO row) trains on `trained`; refused when `other`
    orders some pair of responses oppositely (a tie in one is no disagreement), as it would be
    ignored. `ranks`: `other` is ranks (1 = best), else higher is better; `drop`: what to do
    besides fixing the row."""
    better = (lambda i, j: other[i] < other[j]) if ranks else (lambda i, j: other[i] > other[j])
    for i, j in itertools.permutations(range(len(trained)), 2):
        if better(i, j) and trained[i] < trained[j]:
            raise fail(
                f"{trained_col} and {other_col}",
                f"they disagree: {other_col}[{i}] = {other[i]:g} {'ranks' if ranks else 'scores'} response {i} above "
                f"response {j} ({other_col}[{j}] = {other[j]:g}), {trained_col}[{i}] = {trained[i]:g} scores it below "
                f"({trained_col}[{j}] = {trained[j]:g})",
                f"POFE trains on {trained_col} when a row has both, so {other_col} would be ignored: fix the row, "
                f"or {drop}.",
            )


# How far above 0 a summed log-prob may be from rounding alone (each token's log-softmax is
# <= 0 up to float32 rounding, ~1e-7, over up to thousands of tokens)
LOGP_ROUNDING = 1e-3


def label_number(row: Mapping[str, Any], col: str, fail) -> float:
    """The number in column `col` of `row`, checked (`checked_number`)."""
    return checkedlabel_number(row.get(col), col, fail)


def checkedlabel_number(value: Any, field: str, fail) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(field, f"expected a number, got {value!r}", "Fix or remove this row.")
    if not math.isfinite(value):
        raise fail(field, f"{value} is not finite", "Fix or remove this row.")
    with np.errstate(over="ignore"):
        if not np.isfinite(np.float32(value)):
            raise fail(
                field,
                f"{value} overflows float32 (training's precision) to inf",
                "Rescale the values of this dataset to within about 1e38.",
            )
    return float(value)


def label_numbers(row: Mapping[str, Any], col: str, k: int, fail) -> list[float]:
    """The k numbers, one per response, in list column `col` of `row`, each checked."""
    values = row.get(col)
    if not isinstance(values, (list, tuple)):
        raise fail(col, f"expected a list of {k} numbers, got {values!r:.80}", "Give one value per response.")
    if len(values) != k:
        raise fail(
            col, f"{len(values)} values for {k} responses", "Give exactly one value per response, in the same order."
        )
    return [checkedlabel_number(v, f"{col}[{j}]", fail) for j, v in enumerate(values)]


def label_log_probs(row: Mapping[str, Any], col: str, k: int, fail) -> list[float]:
    """k summed log-probs, each <= 0 (a probability is at most 1) up to rounding."""
    values = label_numbers(row, col, k, fail)
    for j, v in enumerate(values):
        if v > LOGP_ROUNDING:
            raise fail(
                f"{col}[{j}]",
                f"log-prob {v:g} is positive, so a probability above 1",
                "Anchor log-probs are sums of token log-probs (<= 0): recompute them, or remove the "
                "column to let the trainer compute the anchor.",
            )
    return values
