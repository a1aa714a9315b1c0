"""The generator interface every backend implements (a leaf: backends and the factory import it)."""

from __future__ import annotations

from typing import Protocol

from ..config import Sampling


class Generator(Protocol):
    name: str

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[str]]:
        """prompts: P rendered prompt strings -> P lists of exactly n candidates each."""
        ...
