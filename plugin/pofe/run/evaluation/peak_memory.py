"""Peak memory of evaluation's parts (`pofe.run.evaluation.evaluate`), logged and recorded.

Two parts: the answers (every policy, one at a time, and pi_0's pass for the KL) and the
judging (the judges, built after the last policy is freed). On a GPU each part's peak is
`torch.cuda.max_memory_allocated()`, reset when the part starts: the tensors torch allocated
(the CUDA context and the caching allocator's spare blocks come on top). On the CPU it is the
process's resident-set peak, `resource.getrusage(RUSAGE_SELF).ru_maxrss`, which cannot be
reset: the judging's figure is the peak so far, never below the answers' (equal when judging
did not raise it).
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable

import torch

GIB = 2**30


class PeakMemory:
    """Each part's peak, in GiB: `part(name)` ends a part, `record()` is what the files keep."""

    def __init__(self) -> None:
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.parts: dict[str, float] = {}
        self._reset()

    def _reset(self) -> None:
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def _peak_gib(self) -> float:
        if self.device == "cuda":
            return torch.cuda.max_memory_allocated() / GIB
        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return max_rss / (GIB if sys.platform == "darwin" else GIB // 1024)

    def part(self, name: str, echo: Callable[[str], object]) -> None:
        """End part `name`: log its peak through `echo`, keep it, and start the next part."""
        gib = round(self._peak_gib(), 3)
        self.parts[f"{name}_gib"] = gib
        how = "torch.cuda.max_memory_allocated" if self.device == "cuda" else "peak resident set size"
        echo(f"eval: peak memory of the {name}: {gib:.3f} GiB ({self.device}, {how})")
        self._reset()

    def record(self) -> dict:
        """{"device": "cpu" | "cuda", "<part>_gib": peak, ...}, as headline.json and eval.json keep it."""
        return {"device": self.device, **self.parts}
