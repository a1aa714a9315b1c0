"""An LLM judge's rubric: its placeholders filled in (`fill_rubric`) and checked at config time
(`check_rubric`). Which placeholders a judge type fills is its spec's (`judge_kinds`).

Only the known placeholders are filled in (`{low}` and `{high}` take a format spec, e.g.
`{low:g}`); any other brace is literal text, so a rubric can show JSON such as {"score": 7}
as it is.
"""

from __future__ import annotations

import re

_NUMERIC_FIELDS = ("low", "high")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)(?::([^{}]*))?\}")


def fill_rubric(template: str, values: dict[str, object]) -> str:
    """`template` with each known placeholder `{name}` / `{name:spec}` (a key of `values`)
    replaced by its value, in one pass (a response quoting "{prompt}" is not filled again);
    everything else, other braces included, is kept as written."""

    def one(m: re.Match) -> str:
        name, spec = m.group(1), m.group(2)
        return m.group(0) if name not in values else format(values[name], spec or "")

    return _PLACEHOLDER.sub(one, template)


def check_rubric(template: str, judge_type: str, known: tuple[str, ...], required: tuple[str, ...]) -> None:
    """Raise ValueError if the rubric lacks a `required` placeholder or gives a text field a
    format spec (or a number field a spec that does not format a number). `known`: the
    placeholders `judge_type` fills in."""
    used = {m.group(1): m.group(2) for m in _PLACEHOLDER.finditer(template) if m.group(1) in known}
    missing = [f"{{{f}}}" for f in required if f not in used]
    if missing:
        raise ValueError(
            f"judge.rubric has no {' or '.join(missing)}: the judge would never see the candidate. Placeholders "
            f"filled in for judge.type: {judge_type}: {', '.join(f'{{{f}}}' for f in known)}; any other brace "
            '(e.g. JSON such as {"score": 7}) is kept as written.'
        )
    for m in _PLACEHOLDER.finditer(template):
        name, spec = m.group(1), m.group(2)
        if name not in known or spec is None:
            continue
        try:
            format(1.0 if name in _NUMERIC_FIELDS else "text", spec)
        except ValueError as e:
            raise ValueError(
                f"judge.rubric: {m.group(0)} has a format spec that does not apply ({e}); write {{{name}}}."
            ) from None
