"""Markdown table cells for the report: numbers, free text shown literally, tables."""

from __future__ import annotations

import math
import re

# sampled completions shown per round (report.json keeps them all), and characters per cell
SAMPLES_SHOWN, CELL_CHARS = 4, 200
# win rates all within 1/2 +- this are "clustered": the report says why, and shows a third decimal
CLUSTERED = 0.05
# what starts inline Markdown (emphasis, code, a link or image, HTML, strikethrough) or ends a
# table cell; block syntax (#, +, -, 1.) cannot start inside a cell
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


def missing(x) -> bool:
    """Whether a number is not there: None or NaN."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt(x, digits: int = 3) -> str:
    """A number for a table cell: `digits` decimals for floats, `-` for missing or NaN."""
    if missing(x):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def text_cell(text: str, limit: int = CELL_CHARS) -> str:
    """Free text (a prompt, a completion) as one table cell that shows it literally: cut to
    `limit` characters, Markdown and HTML escaped, line breaks as <br>."""
    if not text:
        return "*(empty)*"  # a real text's asterisks are escaped, so this cannot be one
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    escaped = MARKDOWN_SPECIAL.sub(r"\\\1", cut.replace("&", "&amp;"))
    return "<br>".join(escaped.splitlines())


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def abstained(ev: dict, m: int, judge: str = "") -> str:
    """How many of model m's held-out answers its mean reward reads when the judge (`judge`:
    "" or "_judge2") abstained on some, ` (3 of 16 answers, 13 abstained)`; nothing when it
    scored them all."""
    counts, missing = ev.get(f"reward_count{judge}"), ev.get(f"abstained{judge}")
    if not counts or not missing or not missing[m]:
        return ""
    return f" ({counts[m]} of {counts[m] + missing[m]} answers, {missing[m]} abstained)"


def cut_at_user_turn(ev: dict, m: int) -> str:
    """How many of model m's held-out answers were cut where they began a user turn of their own,
    `(4 of 8 answers cut where they began a user turn)`; nothing when none were (or an eval.json
    from before they were counted)."""
    cut = (ev.get("samples_cut_at_user_turn") or [0] * (m + 1))[m]
    if not cut:
        return ""
    return f"({cut} of {ev['num_prompts'] * ev['decoding']['num_samples']} answers cut where they began a user turn)"
