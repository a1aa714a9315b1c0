"""How many of the prompt pool an iterated run holds out (`pofe.eval.held_out`).

Unset (the default), a fixed slice: 5 % of the pool, at least 16 and at most 256 prompts,
and never more than a fifth of a small pool (a pool under 5 prompts holds none out). The
slice is the pool's last rows: no round trains on them, and every model of the run answers
them (`pofe.run.evaluation`). An explicit n holds out the last n rows; 0 holds out none. A
recipe that names its own held-out prompts (`pofe.eval.prompts`) holds out none of the pool.
"""

from __future__ import annotations

import json

SHARE, AT_LEAST, AT_MOST, MAX_FRACTION_OF_SMALL = 0.05, 16, 256, 5


def default_held_out(pool: int) -> int:
    """The default slice of a pool of `pool` prompts: clamp(round(5 % of pool), 16, 256),
    then at most pool // 5."""
    n = min(AT_MOST, max(AT_LEAST, round(SHARE * pool)))
    return min(n, pool // MAX_FRACTION_OF_SMALL)


def held_out_count(pool: int, held_out: int | None, has_own_prompts: bool) -> int:
    """The number of the pool's last rows to hold out: `held_out` as set, or (None) the
    default slice; none when the recipe names its own held-out prompts."""
    if has_own_prompts:
        return 0
    n = default_held_out(pool) if held_out is None else held_out
    if n >= pool:
        raise ValueError(f"pofe.eval.held_out={n} leaves none of the {pool} prompts to train on: "
                         "hold out fewer (or set `held_out: 0`)")
    return n


def without_held_out(per_round: list[list[dict]], held_rows: list[dict], column: str) -> tuple[list[list[dict]], list[int]]:
    """Each round's rows less those whose prompt (`column`, compared as written) is a held-out
    prompt, and how many each round lost. A round set drawn from the same pool as the
    `datasets:` entry (the SPPO recipes read one hub set for both) would otherwise train on
    the prompts every model is judged on."""
    held = {_prompt_key(row, column) for row in held_rows}
    kept = [[row for row in rows if _prompt_key(row, column) not in held] for rows in per_round]
    return kept, [len(rows) - len(k) for rows, k in zip(per_round, kept)]


def _prompt_key(row: dict, column: str) -> str:
    return json.dumps(row.get(column), sort_keys=True, ensure_ascii=False)
