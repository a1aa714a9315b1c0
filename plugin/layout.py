"""The batch and row layout every POFE layer agrees on: column names and the packed row.

Canonical dataset rows carry `prompt`, `responses` and one per-candidate label column
(`rewards` for RRHF, `win_rates` for SPPO, see `pofe.methods`); tokenised rows carry
`prompt_ids`, `response_ids`, the label columns and `row_id`. The collator turns them
into the batch layouts described in `pofe.collator`.

This module is a leaf: standard library only.
"""

from __future__ import annotations

IGNORE_INDEX = -100

# canonical (rendered) row columns
PROMPT = "prompt"
RESPONSES = "responses"
# per-candidate float columns carried through tokenisation and collation as (B, K) tensors
CANDIDATE_FLOATS = ("rewards", "win_rates", "anchor_logps")
# tokenised row columns (what reaches the collator; not forward() arguments)
TOKENIZED_COLUMNS = ("prompt_ids", "response_ids", *CANDIDATE_FLOATS, "row_id")

# scored response tokens per output-embedding chunk (`pofe.scoring`): the default of
# `pofe.logit_chunk_size`, and the most (tokens x vocab) logits that exist at a time
DEFAULT_LOGIT_CHUNK_SIZE = 1024


def pack_prompt(prompt: list[int], responses: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """One packed row ``prompt, r_1, ..., r_k``: tokens, segment ids and position ids.

    segment ids are 0 on the prompt and i on the i-th response (1-based); positions run
    0..P-1 on the prompt and restart at P for every response. All three have length
    P + sum |r_i|.
    """
    p = len(prompt)
    tokens, segments, positions = list(prompt), [0] * p, list(range(p))
    for i, response in enumerate(responses, start=1):
        tokens += list(response)
        segments += [i] * len(response)
        positions += range(p, p + len(response))
    return tokens, segments, positions
