"""Counts that many threads add to (judge calls, HTTP retries), reported in summary.json."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields
from typing import ClassVar


@dataclass
class Counts:
    """Base for thread-safe counters: subclasses declare int fields and one dict field,
    named by REASONS, that counts reasons by kind (the text before the first ':')."""

    REASONS: ClassVar[str] = "reasons"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, n: int = 1, *, reason: str | None = None) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)
            if reason is not None:
                tally = getattr(self, self.REASONS)
                kind = reason_kind(reason)
                tally[kind] = tally.get(kind, 0) + 1

    def as_dict(self) -> dict:
        with self._lock:
            return {f.name: _copy(getattr(self, f.name)) for f in fields(self) if not f.name.startswith("_")}


def reason_kind(reason: str) -> str:
    """The kind of a reason, for tallies: the text before the first ':' ("NameError: ...")."""
    return reason.split(":")[0][:60]


def _copy(value):
    return dict(value) if isinstance(value, dict) else value
