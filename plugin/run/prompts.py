"""Which prompts each round trains on (`pofe.round_prompts`).

SPPO uses disjoint splits (round t trains on slice t of T contiguous slices, as in the
paper); RRHF's iterated variant (IP-n) resamples the same prompts. `auto` takes the
method's default from `pofe.methods`.
"""

from __future__ import annotations

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
