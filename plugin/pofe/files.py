"""Atomic JSON/JSONL files and stable hashes: the I/O every POFE layer shares.

A file is written to a temporary name in the same folder, flushed and fsynced, then
renamed over its final name with `os.replace` (atomic on POSIX): a run killed at any
moment leaves either the old file or the new one, never half of one.

This module is a leaf: standard library only (huggingface_hub, imported where a hub id is
resolved, is in every environment POFE runs in).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pofe.errors import PofeError


def dumps(row: Any, *, allow_nan: bool = False) -> str:
    """Canonical JSON line (key order as given; NaN only where `allow_nan`, as JSON's `NaN`):
    equal rows give equal bytes."""
    return json.dumps(row, ensure_ascii=False, allow_nan=allow_nan)


def private_opener(name, flags):
    """`open(..., opener=private_opener)`: a file it creates is readable by its owner only."""
    return os.open(name, flags, 0o600)


class WriteFailed(PofeError, OSError):
    """A file POFE writes could not be written (a full disk, no permission): the message names
    the file and the system's reason; `errno` is the system's."""

    def __init__(self, path: Path, error: OSError):
        super().__init__(
            f"could not write {path}: {error.strerror or error} (errno {error.errno}). Nothing of it was left "
            f"half-written. Free space on the disk holding {path.parent} (or make it writable), then run again."
        )
        self.errno, self.filename = error.errno, str(path)

    def __str__(self) -> str:
        return self.args[0]  # OSError's own would be "[Errno 28] None: path"


def write_atomic(path: Path, text: str | bytes, *, private: bool = False) -> None:
    """Write `text` (or bytes: a tensor `torch.save`d to memory first, whose own file writer turns a
    full disk into an iostream RuntimeError naming nothing) to `path` all or nothing (temporary file
    in the same folder, fsync, os.replace); `private`: readable by its owner only (0600), for a file
    that may hold config (a served policy's key). A write that fails (a full disk) removes its
    temporary file and raises `WriteFailed` naming `path`: the bare OSError names neither the file
    nor what to do."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    mode = {"mode": "wb"} if isinstance(text, bytes) else {"mode": "w", "encoding": "utf-8"}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)  # os.open's mode applies only to a file it creates
        with open(tmp, **mode, opener=private_opener if private else None) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise WriteFailed(path, e) from e


def write_jsonl_atomic(path: Path, rows: Iterable[Any], *, allow_nan: bool = False) -> None:
    """`rows` as JSON Lines, all or nothing; `allow_nan`: a NaN (an abstention's reward) is
    written as `NaN`, else refused."""
    write_atomic(path, "".join(dumps(r, allow_nan=allow_nan) + "\n" for r in rows))


class UnreadableFile(PofeError, ValueError):
    """A JSON or JSON Lines file that cannot be read as one: the message names the file, the
    line and what is wrong."""


def read_utf8(path: Path) -> str:
    """The file's text; `UnreadableFile` naming the line and byte offset of a byte that is not UTF-8."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UnreadableFile(
            f"{path}, line {line}: byte {raw[e.start : e.start + 1]!r} at offset {e.start} is not UTF-8 "
            f"({e.reason}). JSON files must be UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8) or fix "
            "that line."
        ) from None


def read_json(path: Path, fix: str) -> Any:
    """The JSON value in `path`; `UnreadableFile` naming the file, where its JSON stops (a file
    cut short by a full disk or an interrupted copy) and `fix`, what to do about it: a bare
    JSONDecodeError names neither."""
    try:
        return json.loads(read_utf8(path))
    except json.JSONDecodeError as e:
        raise UnreadableFile(f"{path} {not_json(e)}. {fix}") from None


def not_json(e: json.JSONDecodeError) -> str:
    """Where a file stops being JSON, as `read_json` says it."""
    return f"is not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}): cut short or edited"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every row of a JSON Lines file, each a JSON object (blank lines skipped), values as written.

    One reader for POFE's own files and users' datasets: a line that is not valid JSON, not an
    object, or holds a lone surrogate (valid JSON, not valid Unicode: tokenizers fail on it
    later with an unrelated TypeError) raises `UnreadableFile` naming the file, line and field.
    """
    rows = []
    for n, line in enumerate(read_utf8(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UnreadableFile(f"{where}: not valid JSON ({e.msg}, column {e.colno}). {ONE_OBJECT}") from None
        if not isinstance(row, dict):
            raise UnreadableFile(f"{where}: expected a JSON object, got {type(row).__name__}. {ONE_OBJECT}")
        if "\\ud" in line or "\\uD" in line:  # the only way decoded UTF-8 text holds a surrogate
            check_unicode(row, where)
        rows.append(row)
    return rows


ONE_OBJECT = "Each line must be one JSON object (JSON Lines)"


def check_unicode(row: dict, where: str) -> None:
    """Raise `UnreadableFile` if a string in `row` holds a lone surrogate ("\\ud800")."""

    def walk(value, field: str) -> None:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise UnreadableFile(
                    f"{where}, field {field!r}: {e.reason} at character {e.start} "
                    f"({value[max(0, e.start - 20) : e.end]!r}), not valid Unicode. Fix the text (a surrogate "
                    "pair \\ud83d\\ude00 is fine; half of one is not) or remove the row."
                ) from None
        elif isinstance(value, dict):
            for key, v in value.items():
                walk(v, f"{field}.{key}" if field else str(key))
        elif isinstance(value, list):
            for j, v in enumerate(value):
                walk(v, f"{field}[{j}]")

    walk(row, "")


def stable_hash(obj: Any, length: int | None = None) -> str:
    """sha256 of `obj` as sorted-key JSON (non-JSON values by `str`), hex, optionally cut."""
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
    return digest[:length] if length else digest


def file_sha256(*paths: Path) -> str | None:
    """sha256 of the files' bytes, in the order given, hex; None when there is none, or one
    of them is missing."""
    paths = [Path(p) for p in paths]
    if not paths or not all(p.is_file() for p in paths):
        return None
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


# A file up to this size is known by its whole content; a larger one (a weights shard) by its
# size, modification time and three samples: reading a 70B model's 140 GB at every start
# would take minutes, and rewriting such a file, even unchanged, then counts as a change.
CONTENT_HASH_CAP = 64 * 2**20
SAMPLE_BYTES = 2**20  # each of the start, the middle and the end of a larger file


def _file_fingerprint(path: Path) -> str:
    stat = path.stat()
    if stat.st_size <= CONTENT_HASH_CAP:
        return file_sha256(path)
    digest = hashlib.sha256(f"{stat.st_size} {stat.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        for offset in (0, stat.st_size // 2, max(stat.st_size - SAMPLE_BYTES, 0)):
            f.seek(offset)
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def weights_fingerprint(model: str | Path, revision: str | None = None) -> str:
    """What identifies the weights at `model`, for a cache keyed on them (SPPO's anchor table,
    a judge's verdicts, evaluation's stored answers).

    A local folder: sha256 over its files' names and fingerprints (its top-level files, what
    `from_pretrained` reads; a file up to `CONTENT_HASH_CAP` by its content, a larger one by
    size, mtime and sampled bytes). A local file: the same over that file. A hub id: the
    commit its local cache resolves `revision` (main) to, "commit <sha>", or "not cached"
    before its first download.
    """
    path = Path(model)
    if path.exists():
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        return stable_hash([[p.name, _file_fingerprint(p)] for p in files])
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(str(model), "config.json", revision=revision)
    except HFValidationError:  # neither a local path nor a hub id
        return "not found"
    return f"commit {Path(cached).parent.name}" if isinstance(cached, str) else "not cached"
