"""Typed records of what POFE's stages write: each file's fields, its form, and how it is read.

The stage that owns a file's numbers writes its record (`Record.write`); everyone else (the run
report, a round's console line) reads it back through the same model (`Record.read`). A file of
another form (`format`: an older POFE's) or with a field missing or mistyped is refused where it
is read, naming the file and what rewrites it, rather than failing as a KeyError deep in a table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from pofe.files import UnreadableFile, read_json, write_atomic


class Record(BaseModel):
    """A file one stage writes and others read. `FORMAT` is the form this POFE writes; a file
    recording another is refused. A reward that a judge abstained on is NaN, kept as written."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    FORMAT: ClassVar[int]
    format: int

    @classmethod
    def read(cls, path: Path, fix: str) -> Self:
        """The record in `path`; `UnreadableFile` naming the file, what is wrong and `fix` (what
        rewrites it) when it is cut short, of another form or not this record's fields."""
        data = read_json(path, fix)
        written = data.get("format", "1, unrecorded") if isinstance(data, dict) else "unknown"
        if written != cls.FORMAT:
            raise UnreadableFile(
                f"{path} is in another form than this POFE reads (format {written}, this one reads "
                f"{cls.FORMAT}: an older POFE wrote it). {fix}"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise UnreadableFile(f"{path}: field {field!r}: {first['msg']} (edited?). {fix}") from None

    @classmethod
    def read_if_written(cls, path: Path, fix: str) -> Self | None:
        """`read`, or None when there is no file at `path` (the stage has not run)."""
        return cls.read(path, fix) if Path(path).exists() else None

    def write(self, path: Path, *, private: bool = False) -> None:
        """Write the record to `path` all or nothing (`pofe.files.write_atomic`), keys sorted."""
        text = json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True, allow_nan=True)
        write_atomic(path, text + "\n", private=private)
