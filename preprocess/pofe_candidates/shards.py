"""Resumable JSONL shards, written atomically (pofe.files) and verified when read back.

A run killed at any moment leaves each shard either complete or absent (plus perhaps a
`*.tmp-*` file, ignored and removed on the next start), so a restarted run redoes only the
missing shards: no row lost, none duplicated. A shard damaged after it was written (cut at a
line boundary, emptied, edited) is caught on resume by the checks below and redone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TypeVar

from pofe.files import read_jsonl
from pofe.logs import logger_name

LOG = logging.getLogger(logger_name(__name__))

T = TypeVar("T")


def shard_path(stage_dir: Path, index: int) -> Path:
    return stage_dir / f"shard-{index:05d}.jsonl"


def read_shard(path: Path) -> list[dict]:
    """A shard's rows; a corrupt shard (never written by POFE) says how to redo it."""
    try:
        return read_jsonl(path)
    except ValueError as e:
        raise ValueError(f"{e}; delete this shard to redo it") from e


def read_verified(path: Path, check: Callable[[list[dict]], str | None]) -> tuple[list[dict] | None, str | None]:
    """(rows, None) for a shard that passes `check`; (None, None) if there is none; (None, why)
    for a damaged one, which is removed so that the stage redoes it."""
    if not path.exists():
        return None, None
    try:
        rows = read_jsonl(path)
        why = check(rows)
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or rows without the shard's fields
        why = f"unreadable: {e}"
    if why is None:
        return rows, None
    path.unlink()
    return None, why


def check_generate_shard(rows: list[dict], first_index: int, planned: int) -> str | None:
    """Why a generate shard is not the one planned (None if it is): it must hold `planned` rows
    with the consecutive dataset indices first_index, first_index + 1, ..."""
    want = list(range(first_index, first_index + planned))
    got = [r["index"] for r in rows]
    if got != want:
        return f"{len(got)} rows with indices {_span(got)}, planned {planned} rows with indices {_span(want)}"
    return None


def check_judge_shard(judged: list[dict], generated: list[dict]) -> str | None:
    """Why a judge shard does not match its generate shard (None if it does): the same rows
    and prompts, and every candidate accounted for (kept, or abstained for a scalar judge)."""
    have, want = [r["index"] for r in judged], [g["index"] for g in generated]
    if have != want:
        return f"rows {_span(have)}, its generate shard has rows {_span(want)}"
    for j, g in zip(judged, generated):
        scalar_abstained = j["abstained"] if j["rewards"] is not None else 0
        n = len(g["candidates"]) if g["dropped"] is None else 0
        if j["prompt"] != g["prompt"] or len(j["responses"]) + scalar_abstained != n:
            return f"row {j['index']} does not match its generate shard ({n} candidates)"
    return None


def _span(indices: list[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if indices else "none"


def clean_tmp(stage_dir: Path) -> int:
    """Remove temporaries left by a killed run; returns how many."""
    n = 0
    if stage_dir.is_dir():
        for p in stage_dir.glob("*.tmp-*"):
            p.unlink(missing_ok=True)
            n += 1
    return n


def judged_in_turn(todo: list[int], work: Callable[[int], T], side_by_side: int = 1) -> Iterator[tuple[int, T]]:
    """(s, work(s)) for each shard s of `todo`: one at a time in order, or `side_by_side` at
    once, each as it finishes (a judge whose requests wait on a server keeps its window full
    across shard boundaries). Stopping early (an error, or the caller's) cancels the shards
    not started and waits for the running ones."""
    if side_by_side <= 1:
        for s in todo:
            yield s, work(s)
        return
    pool = ThreadPoolExecutor(max_workers=side_by_side, thread_name_prefix="pofe-judge-shard")
    try:
        running = {pool.submit(work, s): s for s in todo}
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=running.get):
                yield running.pop(future), future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def reuse_shard(stage_dir: Path, s: int, check, redone: dict[str, int]) -> list[dict] | None:
    """Shard s's rows if it exists and passes `check`; a damaged one is removed and counted
    in `redone` under its stage's name."""
    path = shard_path(stage_dir, s)
    rows, why = read_verified(path, check)
    if why is not None:
        LOG.warning(f"POFE: {path} is damaged ({why}); redoing it")
        redone[stage_dir.name] = redone.get(stage_dir.name, 0) + 1
    return rows


def progress_bar(enabled: bool, total: int, desc: str, done: int = 0):
    """A stage's tqdm bar over its prompts (`candidates.progress`), started at those already done."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc=f"pofe {desc}", unit="prompt", disable=not enabled, dynamic_ncols=True)
