"""Which prompts each round trains on (`pofe.round_prompts`), and which are held out.

SPPO uses disjoint splits (round t trains on slice t of T contiguous slices, as in the
paper); RRHF's iterated variant (IP-n) resamples the same prompts. `auto` takes the
method's default from `pofe.methods`. A list names one prompt set per round (the SPPO
authors draw a new one per iteration): a local file, or a dataset spec, read as the recipe's
`datasets:` entry would read it (`load_round_prompts`).

How many of the prompt pool a run holds out (`pofe.eval.held_out`). Unset (the default), a
fixed slice: 5 % of the pool, at least 16 and at most 256 prompts,
and never more than a fifth of a small pool (a pool under 5 prompts holds none out). The
slice is the pool's last rows: no round trains on them, and every model of the run answers
them (`pofe.run.evaluation.evaluate`). An explicit n holds out the last n rows; 0 holds out none. A
recipe that names its own held-out prompts (`pofe.eval.prompts`) holds out none of the pool.
"""

from __future__ import annotations

import json
from typing import Any

from pofe.args.rounds import RoundPromptSet, RoundPromptSource
from pofe.methods import method_spec


def split_prompts(n: int, rounds: int, mode: str) -> list[range]:
    """Row ranges per round: `split` cuts 0..n-1 into `rounds` contiguous disjoint slices
    (sizes differ by at most one, earlier slices larger); `all` gives every round 0..n-1."""
    if mode == "all":
        return [range(n)] * rounds
    if n < rounds:
        raise ValueError(f"{n} prompts cannot be split into {rounds} disjoint rounds")
    base, extra = divmod(n, rounds)
    out, start = [], 0
    for t in range(rounds):
        size = base + (1 if t < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def resolve_round_prompts(method: str, mode: str) -> str:
    """`split` or `all`: `mode` itself, or the method's default when `auto`."""
    if mode != "auto":
        return mode
    return method_spec(method).default_round_prompts


def round_entry(entry: Any, source: RoundPromptSource):
    """The recipe's `datasets:` entry (its type and field keys) pointed at one round's prompts."""
    from axolotl.utils.dict import DictDefault

    if isinstance(source, RoundPromptSet):
        where = source.model_dump()
    else:
        where = {"path": source, "ds_type": None, "split": None, "data_files": None, "name": None, "revision": None}
    return DictDefault({**entry, **where})


def load_round_prompts(entry: Any, sources: list[RoundPromptSource], use_auth_token) -> list[list[dict]]:
    """Each round's prompt rows, loaded as a `datasets:` entry is (`pofe.data.sources.load_entry`,
    axolotl's loader for all but local JSON files); a spec that does not load raises naming
    the round and the spec."""
    from datasets import DatasetDict

    from pofe.data.sources import load_entry

    out = []
    for t, source in enumerate(sources, start=1):
        what = f"pofe.round_prompts[{t - 1}] (round {t}): {_describe(source)}"
        try:
            rows = load_entry(round_entry(entry, source), use_auth_token)
        except (ValueError, OSError, KeyError) as e:
            raise ValueError(
                f"{what} does not load ({type(e).__name__}: {e}). Check path (a hub dataset id, or a local "
                "file or folder), name, split and data_files; a gated or private hub dataset needs "
                "`hf auth login` (or HF_TOKEN)."
            ) from e
        if isinstance(rows, DatasetDict):  # a save_to_disk folder of splits: axolotl returns them all
            split = source.split if isinstance(source, RoundPromptSet) else "train"
            if split not in rows:
                raise ValueError(f"{what} has splits {sorted(rows)}, not {split!r}: set `split`")
            rows = rows[split]
        out.append(list(rows))
    return out


def _describe(source: RoundPromptSource) -> str:
    if not isinstance(source, RoundPromptSet):
        return f"file {source!r}"
    return "dataset " + ", ".join(f"{k}={v!r}" for k, v in source.model_dump(exclude_none=True).items())


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
        raise ValueError(
            f"pofe.eval.held_out={n} leaves none of the {pool} prompts to train on: "
            "hold out fewer (or set `held_out: 0`)"
        )
    return n


def without_held_out(
    per_round: list[list[dict]], held_rows: list[dict], column: str
) -> tuple[list[list[dict]], list[int]]:
    """Each round's rows less those whose prompt (`column`, compared as written) is a held-out
    prompt, and how many each round lost. A round set drawn from the same pool as the
    `datasets:` entry (the SPPO recipes read one hub set for both) would otherwise train on
    the prompts every model is judged on."""
    held = {_prompt_key(row, column) for row in held_rows}
    kept = [[row for row in rows if _prompt_key(row, column) not in held] for rows in per_round]
    return kept, [len(rows) - len(k) for rows, k in zip(per_round, kept)]


def _prompt_key(row: dict, column: str) -> str:
    return json.dumps(row.get(column), sort_keys=True, ensure_ascii=False)
