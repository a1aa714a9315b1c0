"""Atomic, resumable JSONL shards.

A shard is written to a temporary file in the same directory, flushed and fsynced, then
renamed over its final name with `os.replace` (atomic on POSIX). A run killed at any moment
leaves each shard either complete or absent (plus perhaps a `*.tmp-*` file, ignored and
removed on the next start), so a restarted run redoes only the missing shards: no row lost,
none duplicated.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable


def dumps(row: Any) -> str:
    """Canonical JSON line (key order as given, no NaN): equal rows give equal bytes."""
    return json.dumps(row, ensure_ascii=False, allow_nan=False)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_jsonl_atomic(path: Path, rows: Iterable[Any]) -> None:
    write_atomic(path, "".join(dumps(r) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[Any]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e}); delete this shard to redo it") from e
    return rows


def shard_path(stage_dir: Path, index: int) -> Path:
    return stage_dir / f"shard-{index:05d}.jsonl"


def clean_tmp(stage_dir: Path) -> int:
    """Remove temporaries left by a killed run; returns how many."""
    n = 0
    if stage_dir.is_dir():
        for p in stage_dir.glob("*.tmp-*"):
            p.unlink(missing_ok=True)
            n += 1
    return n
