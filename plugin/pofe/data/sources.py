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

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from datasets import Dataset, Json, ReadInstruction

from pofe.compat.axolotl_datasets import is_json, load_with_axolotl
from pofe.data.formats import PofeDataError
from pofe.files import ONE_OBJECT, UnreadableFile, check_unicode, file_sha256, read_jsonl, read_utf8, stable_hash


def load_entry(entry, use_auth_token) -> Dataset:
    """The raw rows of one `datasets:` entry."""
    if Path(entry.path).is_file() and is_json(entry):
        return read_json_rows(entry.path, entry.split)
    return load_with_axolotl(entry, use_auth_token)


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
    """The rows of a JSON Lines file, or of a file that is one JSON list of objects."""
    try:
        text = read_utf8(path)
        if not text.lstrip().startswith("["):
            return read_jsonl(path)
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise PofeDataError(
            f"dataset {path}, line {e.lineno}: not valid JSON ({e.msg}, column {e.colno}). {EITHER}"
        ) from None
    except UnreadableFile as e:
        raise PofeDataError(f"dataset {e}" + (f", {LIST}" if ONE_OBJECT in str(e) else "")) from None
    escapes = "\\ud" in text or "\\uD" in text  # the only way decoded UTF-8 text holds a surrogate
    for i, row in enumerate(rows):
        where = f"dataset {path}, row {i} (0-based)"
        if not isinstance(row, dict):
            raise PofeDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        try:
            if escapes:
                check_unicode(row, where)
        except UnreadableFile as e:
            raise PofeDataError(str(e)) from None
    return rows


LIST = "or the whole file one JSON list of objects."
EITHER = f"{ONE_OBJECT}, {LIST}"


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
        digests.append(stable_hash([[str(f.relative_to(path)), file_sha256(f)] for f in files]))
    return digests
