"""The check's table and JSON. A row is one claim: `pass`, `FAIL`, `measured` (a speed figure,
not a correctness claim), `needs GPU` (it runs on a GPU only; on the CPU it is reported, never
counted as a pass) or `skipped: <why>`."""

from __future__ import annotations

import json
from pathlib import Path


def row(check: str, status: str, detail: str = "", **values) -> dict:
    return {"check": check, "status": status, "detail": detail, **values}


def table(rows: list[dict]) -> str:
    width = max(len(r["check"]) for r in rows)
    lines = [f"{'check':<{width}}  {'status':<10}  detail", "-" * (width + 40)]
    lines += [f"{r['check']:<{width}}  {r['status']:<10}  {r['detail']}" for r in rows]
    count = {s: sum(r["status"] == s for r in rows) for s in ("pass", "FAIL", "measured")}
    rest = len(rows) - sum(count.values())
    lines.append(
        f"\n{count['pass']} pass, {count['FAIL']} FAIL, {count['measured']} measured, "
        f"{rest} not run here (needs GPU / skipped)"
    )
    return "\n".join(lines)


def write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
