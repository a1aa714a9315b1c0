"""Where a dataset entry's rows come from, and a digest of their content.

Local JSON / JSON Lines files are read here rather than by `datasets`: its JSON builder
stores a column that mixes strings and messages as JSON text but leaves every string
that already parses as JSON unencoded, so the response "32" reads back as the int 32
(and "null" as None). Here such a column is JSON-encoded in full, which reads back
exactly, and a malformed line is an error naming the file and the line, not a pyarrow
traceback. Everything else (hub, remote, parquet, saved datasets) goes through axolotl's
`load_dataset_with_config`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from axolotl.utils.data.shared import get_dataset_type, load_dataset_with_config
from datasets import Dataset, Json, ReadInstruction

from pofe.data.formats import PofeDataError


def load_entry(entry, use_auth_token) -> Dataset:
    """The raw rows of one `datasets:` entry."""
    if Path(entry.path).is_file() and get_dataset_type(entry) == "json":
        return read_json_rows(entry.path, entry.split)
    return load_dataset_with_config(entry, use_auth_token)


def read_json_rows(path: str | Path, split: str | None = None) -> Dataset:
    """A JSON Lines file (or one JSON list of objects) as a Dataset, values as written.

    `split` takes `datasets`' slice syntax over the file's one split, "train" ("train[:100]").
    """
    rows = _parse_objects(Path(path))
    if not rows:
        raise PofeDataError(f"dataset {path}: the file has no rows")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    data, mixed = {}, []
    for column in columns:
        values = [row.get(column) for row in rows]
        try:
            pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            # one Arrow type cannot hold them (strings beside messages): keep JSON text
            values = [json.dumps(v) for v in values]
            mixed.append(column)
        data[column] = values
    dataset = Dataset.from_dict(data)
    for column in mixed:
        dataset = dataset.cast_column(column, Json())
    if split and split != "train":
        parts = ReadInstruction.from_spec(split).to_absolute({"train": len(dataset)})
        indices = [i for part in parts for i in range(part.from_, part.to)]
        dataset = dataset.select(indices)
    return dataset


def _parse_objects(path: Path) -> list[dict[str, Any]]:
    def fail(line: int, what: str) -> PofeDataError:
        return PofeDataError(
            f"dataset {path}, line {line}: {what}. Each line must be one JSON object "
            "(JSON Lines), or the whole file one JSON list of objects."
        )

    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise PofeDataError(
            f"dataset {path}, line {line}: byte {raw[e.start : e.start + 1]!r} at offset {e.start} is not UTF-8 "
            f"({e.reason}). JSON files must be UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8) or fix "
            "that line."
        ) from None
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise fail(e.lineno, f"not valid JSON ({e.msg}, column {e.colno})") from None
        escapes = _has_surrogate_escape(text)
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise PofeDataError(
                    f"dataset {path}, row {i} (0-based): expected a JSON object, got {type(row).__name__}"
                )
            if escapes:
                _check_unicode(row, f"dataset {path}, row {i} (0-based)")
        return rows
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise fail(n, f"not valid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(row, dict):
            raise fail(n, f"expected a JSON object, got {type(row).__name__}")
        if _has_surrogate_escape(line):
            _check_unicode(row, f"dataset {path}, line {n}")
        rows.append(row)
    return rows


def _has_surrogate_escape(text: str) -> bool:
    """Whether `text` has a \\uD800-\\uDFFF escape: the only way decoded UTF-8 text gives a
    surrogate, so only such rows need `_check_unicode`."""
    return "\\ud" in text or "\\uD" in text


def _check_unicode(row: dict, where: str) -> None:
    """Raise PofeDataError if a string in `row` holds a lone surrogate ("\\ud800": valid JSON,
    not valid Unicode; tokenizers fail on it with an unrelated TypeError)."""

    def walk(value, field: str) -> None:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise PofeDataError(
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


def local_files_digest(entries) -> list[str | None]:
    """sha256 of each entry's local data (its file, or every file under its folder, with
    their relative names); None for a hub or remote dataset, whose revision names it.

    Keys the prepared dataset on what the files hold, so a file edited in place is
    prepared again instead of read back from a stale cache.
    """
    digests = []
    for entry in entries:
        path = Path(entry.path)
        if not path.exists():
            digests.append(None)
            continue
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        digest = hashlib.sha256()
        for file in files:
            digest.update(str(file.relative_to(path)).encode() + b"\0")
            with file.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            digest.update(b"\0")
        digests.append(digest.hexdigest())
    return digests
