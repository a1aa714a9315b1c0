"""Remove exact and near-duplicate candidates.

Beam search and low-temperature sampling often return the same answer several times, or
answers differing only in case or spacing. Such pairs carry no ranking signal for RRHF
(near-ties) and waste judge calls, so they are dropped before judging.

"Near" is deliberately narrow: only what cannot change an answer is normalised. Signs,
operators, digits, units and inner punctuation stay ("19" / "-19", "x = 3" / "x = -3",
"2+2=4" / "2*2=4", "$5" / "5%", "5!" / "5" are all different answers); a merged pair would
drop the right answer or the wrong one by chance, while a missed near-duplicate only costs a
judge call.
"""

from __future__ import annotations

import re
import unicodedata

_SPACE = re.compile(r"\s+")
_FULL_STOPS = re.compile(r"[.\u3002]+$")  # sentence-final full stops ("Four." = "four")


def normalise(text: str) -> str:
    """Canonical form for duplicate detection: NFKC, case-folded, runs of whitespace as one
    space, no leading/trailing whitespace, no final full stop(s)."""
    text = _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()
    return _FULL_STOPS.sub("", text).rstrip()


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
