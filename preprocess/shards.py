"""Resumable JSONL shards, written atomically (pofe.files).

A run killed at any moment leaves each shard either complete or absent (plus perhaps a
`*.tmp-*` file, ignored and removed on the next start), so a restarted run redoes only the
missing shards: no row lost, none duplicated.
"""

from __future__ import annotations

from pathlib import Path

from pofe.files import read_jsonl


def shard_path(stage_dir: Path, index: int) -> Path:
    return stage_dir / f"shard-{index:05d}.jsonl"


def read_shard(path: Path) -> list[dict]:
    """A shard's rows; a corrupt shard (never written by POFE) says how to redo it."""
    try:
        return read_jsonl(path)
    except ValueError as e:
        raise ValueError(f"{e}; delete this shard to redo it") from e


def clean_tmp(stage_dir: Path) -> int:
    """Remove temporaries left by a killed run; returns how many."""
    n = 0
    if stage_dir.is_dir():
        for p in stage_dir.glob("*.tmp-*"):
            p.unlink(missing_ok=True)
            n += 1
    return n
