"""Atomic JSON/JSONL files and stable hashes: the I/O every POFE layer shares.

A file is written to a temporary name in the same folder, flushed and fsynced, then
renamed over its final name with `os.replace` (atomic on POSIX): a run killed at any
moment leaves either the old file or the new one, never half of one.

This module is a leaf: standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def dumps(row: Any) -> str:
    """Canonical JSON line (key order as given, no NaN): equal rows give equal bytes."""
    return json.dumps(row, ensure_ascii=False, allow_nan=False)


def private_opener(name, flags):
    """`open(..., opener=private_opener)`: a file it creates is readable by its owner only."""
    return os.open(name, flags, 0o600)


def write_atomic(path: Path, text: str, *, private: bool = False) -> None:
    """Write `text` to `path` all or nothing (temporary file, fsync, os.replace); `private`:
    readable by its owner only (0600), for a file that may hold config (a served policy's key)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)  # os.open's mode applies only to a file it creates
    with open(tmp, "w", encoding="utf-8", opener=private_opener if private else None) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_jsonl_atomic(path: Path, rows: Iterable[Any]) -> None:
    write_atomic(path, "".join(dumps(r) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[Any]:
    """Every row of a JSONL file; a bad line names the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e})") from e
    return rows


def stable_hash(obj: Any, length: int | None = None) -> str:
    """sha256 of `obj` as sorted-key JSON (non-JSON values by `str`), hex, optionally cut."""
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
    return digest[:length] if length else digest


def file_sha256(path: Path) -> str | None:
    """sha256 of a file's bytes, hex; None when there is no such file."""
    path = Path(path)
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
