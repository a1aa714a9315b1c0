"""The entries: what each reaches, the releases it was written for, and when it can go."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    reaches: str  # the library and what of it
    names: tuple[str, ...]  # its identifiers, which no other module of POFE may use
    written_for: str  # the releases it was written and is tested for
    goes_when: str  # when it can be removed


ENTRIES: dict[str, Entry] = {}


def entry(reaches: str, names: tuple[str, ...], written_for: str, goes_when: str):
    """Register the decorated function, method or class as an entry, under its qualified name."""

    def register(obj):
        ENTRIES[obj.__qualname__] = Entry(reaches, names, written_for, goes_when)
        return obj

    return register
