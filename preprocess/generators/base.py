"""The generator interface every backend implements (a leaf: backends and the factory import it)."""

from __future__ import annotations

from typing import Protocol

from ..config import Sampling


class Completion(str):
    """A candidate's text, and why decoding ended: `finish_reason` "stop" (a stop token) or
    "length" (cut at max_new_tokens). A str, so everything that reads candidates reads it as
    text; a backend that cannot tell returns plain strings (finish reason unknown)."""

    finish_reason: str

    def __new__(cls, text: str, finish_reason: str) -> Completion:
        out = super().__new__(cls, text)
        out.finish_reason = finish_reason
        return out


def finish_reason(candidate: str) -> str | None:
    """"stop", "length", or None when the backend did not say."""
    return getattr(candidate, "finish_reason", None)


class Generator(Protocol):
    name: str

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[str]]:
        """prompts: P rendered prompt strings -> P lists of exactly n candidates each
        (`Completion`s where the backend knows why each stopped)."""
        ...
