"""Remove exact and near-duplicate candidates.

Beam search and low-temperature sampling often return the same answer several times, or
answers differing only in case, spacing or punctuation. Such pairs carry no ranking signal
for RRHF (near-ties) and waste judge calls, so they are dropped before judging.
"""

from __future__ import annotations

import re
import string
import unicodedata

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}\u2018\u2019\u201c\u201d\u2013\u2014\u2026]")
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Canonical form for duplicate detection: NFKC, case-folded, no punctuation, single spaces."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _PUNCT.sub(" ", text)
    return _SPACE.sub(" ", text).strip()


def dedupe(candidates: list[str]) -> tuple[list[int], int, int]:
    """Indices of candidates to keep (first occurrence wins, order preserved).

    Returns (kept_indices, exact_duplicates, near_duplicates): exact = identical strings,
    near = different strings with the same normalised form.
    """
    seen_exact: set[str] = set()
    seen_norm: set[str] = set()
    kept: list[int] = []
    exact = near = 0
    for i, c in enumerate(candidates):
        if c in seen_exact:
            exact += 1
            continue
        key = normalise(c)
        if key in seen_norm:
            near += 1
            seen_exact.add(c)
            continue
        seen_exact.add(c)
        seen_norm.add(key)
        kept.append(i)
    return kept, exact, near
