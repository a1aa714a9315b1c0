"""PairRM's input sequences, as llm-blender's `CrossCompareCollator` and `cat_ids` build them.

    [CLS] <|source|> x [SEP] [CLS] <|candidate1|> a [SEP] [CLS] <|candidate2|> b [SEP]

`<|source|> x` is cut to `source_maxlength` tokens (specials included), each candidate to
`candidate_maxlength + (source_maxlength - len(source)) // 2` (pairrm.py's docstring).

`encode_pair` builds one sequence from its three texts. `encode_prompts` builds every
ordered pair of many prompts with one tokenizer call for the sources and one per distinct
candidate budget, as llm-blender's collator tokenises each candidate once, not once per pair:
a prompt's K candidates appear in K (K - 1) pairs. The ids are equal to `encode_pair`'s.
"""

from __future__ import annotations

from collections import defaultdict

SOURCE_PREFIX = "<|source|>"
CAND1_PREFIX = "<|candidate1|>"
CAND2_PREFIX = "<|candidate2|>"
CAND_PREFIX = "<|candidate|>"
PREFIX_TOKENS = (SOURCE_PREFIX, CAND1_PREFIX, CAND2_PREFIX, CAND_PREFIX)  # llm-blender's add_tokens order


def _encode(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    # llm-blender turns the separator inside texts into a space: it would split the parts.
    sep = tokenizer.sep_token
    return tokenizer([t.replace(sep, " ") for t in texts], truncation=True, max_length=max_length)["input_ids"]


def _budget(settings, source_ids: list[int]) -> int:
    return settings.candidate_maxlength + (settings.source_maxlength - len(source_ids)) // 2


def _as(ids: list[int], prefix_ids: dict[str, int], prefix: str) -> list[int]:
    """A candidate's ids with its <|candidate|> token made <|candidate1|> or <|candidate2|>."""
    return [prefix_ids[prefix] if t == prefix_ids[CAND_PREFIX] else t for t in ids]


def encode_pair(tokenizer, settings, prefix_ids: dict[str, int], source: str, a: str, b: str) -> list[int]:
    """Token ids of one (source, a, b) sequence in PairRM's layout; `settings` is a
    `PairRMSettings` (its source_maxlength and candidate_maxlength are read)."""
    (src,) = _encode(tokenizer, [SOURCE_PREFIX + source], settings.source_maxlength)
    c1, c2 = _encode(tokenizer, [CAND_PREFIX + a, CAND_PREFIX + b], _budget(settings, src))
    return src + _as(c1, prefix_ids, CAND1_PREFIX) + _as(c2, prefix_ids, CAND2_PREFIX)


def encode_prompts(
    tokenizer,
    settings,
    prefix_ids: dict[str, int],
    sources: list[str],
    candidates: list[list[str]],
) -> list[tuple[int, int, int, list[int]]]:
    """Every ordered pair i != j of every prompt p: (p, i, j, ids), ids as `encode_pair`'s
    for (sources[p], candidates[p][i], candidates[p][j]); prompts in order, then i, then j."""
    srcs = _encode(tokenizer, [SOURCE_PREFIX + s for s in sources], settings.source_maxlength) if sources else []
    by_budget: dict[int, list[tuple[int, int]]] = defaultdict(list)  # budget -> (p, i) it cuts
    for p, cands in enumerate(candidates):
        by_budget[_budget(settings, srcs[p])].extend((p, i) for i in range(len(cands)))
    ids: dict[tuple[int, int], list[int]] = {}
    for budget, slots in by_budget.items():
        encoded = _encode(tokenizer, [CAND_PREFIX + candidates[p][i] for p, i in slots], budget)
        ids.update(zip(slots, encoded, strict=True))
    out = []
    for p, cands in enumerate(candidates):
        first = [_as(ids[p, i], prefix_ids, CAND1_PREFIX) for i in range(len(cands))]
        second = [_as(ids[p, j], prefix_ids, CAND2_PREFIX) for j in range(len(cands))]
        out.extend(
            (p, i, j, srcs[p] + first[i] + second[j]) for i in range(len(cands)) for j in range(len(cands)) if i != j
        )
    return out


__all__ = [
    "CAND1_PREFIX",
    "CAND2_PREFIX",
    "CAND_PREFIX",
    "PREFIX_TOKENS",
    "SOURCE_PREFIX",
    "encode_pair",
    "encode_prompts",
]
