"""Per round, how long the candidates are, and the kept best and worst of them.

From the round's pipeline shards: each candidate's length in tokens (the generate shards'
`candidate_tokens`, the policy's tokenizer on the text: no end-of-turn token) and the
judge's label of each judged candidate (the method's: rewards for RRHF, win rates for
SPPO). Per prompt, the best is the
highest-labelled candidate (the first of equals) and the worst the lowest (the last of
equals), as `keep: best_worst` keeps them (`pofe_candidates.build`): SPPO's chosen and
rejected, RRHF's top and bottom of the ranking. A judge that learns to prefer length shows here
first: the best candidates grow longer than the worst.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pofe.methods import method_spec
from pofe.run.evaluation.headline import shard_rows


def length_stats(xs: list[int]) -> dict:
    """{"mean", "median", "count"} of token counts (None for none)."""
    return {
        "mean": sum(xs) / len(xs) if xs else None,
        "median": float(statistics.median(xs)) if xs else None,
        "count": len(xs),
    }


def candidate_lengths(cand_dir: Path, method: str) -> dict | None:
    """{"candidates", "best", "worst"}: length_stats of all generated candidates and of each
    judged prompt's best and worst; None without generate shards."""
    generated = shard_rows(cand_dir / "generate")
    if not generated:
        return None
    key = "win_rates" if method_spec(method).target.from_win_rates else "rewards"
    live = [g for g in generated if g["dropped"] is None]
    tokens = {g["index"]: dict(zip(g["candidates"], g["candidate_tokens"])) for g in live}
    every = [t for g in live for t in g["candidate_tokens"]]
    best, worst = [], []
    for row in shard_rows(cand_dir / "judge"):
        labels, responses = row.get(key), row.get("responses") or []
        if not labels or row["index"] not in tokens:
            continue
        hi = max(range(len(labels)), key=lambda k: (labels[k], -k))
        lo = min(range(len(labels)), key=lambda k: (labels[k], k))
        if hi == lo:  # all tied: no best or worst
            continue
        best.append(tokens[row["index"]][responses[hi]])
        worst.append(tokens[row["index"]][responses[lo]])
    return {"candidates": length_stats(every), "best": length_stats(best), "worst": length_stats(worst)}
