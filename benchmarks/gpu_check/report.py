"""The check's table and JSON. A row is one claim: `pass`, `FAIL`, `needs GPU` (it runs on a
GPU only; on the CPU it is reported, never counted as a pass) or `skipped: <why>`."""

from __future__ import annotations

import json
from pathlib import Path


def row(check: str, status: str, detail: str = "", **values) -> dict:
    return {"check": check, "status": status, "detail": detail, **values}


def table(rows: list[dict]) -> str:
    width = max(len(r["check"]) for r in rows)
    lines = [f"{'check':<{width}}  {'status':<10}  detail", "-" * (width + 40)]
    lines += [f"{r['check']:<{width}}  {r['status']:<10}  {r['detail']}" for r in rows]
    failed = sum(r["status"] == "FAIL" for r in rows)
    passed = sum(r["status"] == "pass" for r in rows)
    lines.append(f"\n{passed} pass, {failed} FAIL, {len(rows) - passed - failed} not run here (needs GPU / skipped)")
    return "\n".join(lines)


def write(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
