"""Per round, what the length policy did to the rows the round trained on.

The loader writes `length-policy-<hash>.json` beside the round's prepared dataset
(`round-<t>/prepared/`, `pofe.data.loader`) whenever a row was longer than `sequence_len`:
its counts per dataset entry and a record per row touched (`pofe.length_policy`). The
report sums the entries' counts and points at the file for the rows themselves, so a round
that trained on cut prompts or cut responses, or lost rows, says so next to its rewards.
"""

from __future__ import annotations

import json
from pathlib import Path

from pofe.run.report.cells import table

COUNTS = ("rows", "rows_over_sequence_len", "rows_with_turns_cut", "rows_with_responses_cut")


def round_truncation(prepared: Path) -> dict | None:
    """The length policy's counts for the round whose prepared data is in `prepared`, summed
    over its dataset entries, with the record's path; None when no row was over
    `sequence_len` (no record). Of several records (a round prepared again under other
    settings), the newest is the one the round trained on last."""
    records = sorted(prepared.glob("length-policy-*.json"), key=lambda p: p.stat().st_mtime)
    if not records:
        return None
    data = json.loads(records[-1].read_text())
    dropped: dict[str, int] = {}
    for entry in data["datasets"]:
        for reason, n in entry["rows_dropped"].items():
            dropped[reason] = dropped.get(reason, 0) + n
    return {
        "record": str(records[-1]),
        "sequence_len": data["sequence_len"],
        "truncation": data["truncation"],
        **{key: sum(entry[key] for entry in data["datasets"]) for key in COUNTS},
        "rows_dropped": dict(sorted(dropped.items())),
    }


def truncation_section(rep: dict) -> list[str]:
    """### Length policy: per round, rows over sequence_len, cut or dropped (and why)."""
    rows = []
    for r in rep["rounds"]:
        cut = r.get("truncation")
        if cut:
            reasons = ", ".join(f"{k} {v}" for k, v in cut["rows_dropped"].items()) or "none"
            rows.append(
                [
                    str(r["round"]),
                    f"{cut['rows_over_sequence_len']} of {cut['rows']}",
                    f"{cut['truncation']} at {cut['sequence_len']}",
                    str(cut["rows_with_turns_cut"]),
                    str(cut["rows_with_responses_cut"]),
                    f"{sum(cut['rows_dropped'].values())} ({reasons})",
                    f"`{cut['record']}`",
                ]
            )
    if not rows:
        return []
    return [
        "### Length policy",
        "",
        "Rows longer than `sequence_len` (`pofe.truncation`): kept with their oldest prompt turns cut, "
        "kept with responses cut (trained without an end of turn, never as finished), or dropped; the "
        "record names each row.",
        "",
        table(["round", "rows over", "policy", "turns cut", "responses cut", "dropped", "per-row record"], rows),
        "",
    ]
