"""Length-sorted batches for inference passes whose results are keyed by index, not order.

A batch costs about its longest sequence times its size (padding), so batching sequences
of similar length cuts the padding a batch in arrival order carries. The judges and SPPO's
anchor pass put each result back by index, so the order they compute in is free; padding
is masked, so a result depends on its batch only through float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices 0..len(lengths)-1 in batches of at most `batch_size`, longest first (ties in
    index order). Longest first: a batch too big for memory fails at the start of the pass,
    not at its end."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda n: -lengths[n])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


__all__ = ["length_sorted_batches"]
