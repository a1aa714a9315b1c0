"""The columns every POFE layer agrees on: the dataset fields, the row and batch columns, the packed row.

Canonical dataset rows carry `prompt`, `responses` and the method's per-candidate label
column (its `Target`, see `pofe.methods`); tokenised rows carry `prompt_ids`,
`response_ids`, the label columns and `row_id`. The collator turns them into the batch
layouts described in `pofe.collator`.

This module is a leaf: it imports only the method registry (`pofe.methods`).
"""

from __future__ import annotations

from pofe.methods import label_columns

IGNORE_INDEX = -100

# canonical (rendered) row columns
PROMPT = "prompt"
RESPONSES = "responses"
# an anchored method's given log pi_t(y|x) per candidate (SPPO); else the trainer computes them
ANCHOR_LOGPS = "anchor_logps"
# a canonical row's flags: its prompt and responses are tokenised as text, without the chat
# template (`pofe.data.formats`); its implicit prompt, a text, ends inside a word or number that
# its responses continue (`pofe.data.implicit_prompt.splits_a_word`), counted by the loader
AS_TEXT = "as_text"
SPLIT_IN_WORD = "split_in_word"
# pi_0's log pi_0(y|x) per candidate, in an online refresh's rows: for a loss with its own KL to
# pi_0 (Nash-MD) or an anchor mixed toward pi_0 (`pofe.anchor_mix`); offline, pi_0's table
# (`pofe.anchor.pi_0`) gives the latter
PI_0_LOGPS = "pi_0_logps"

# The keys POFE reads on a `datasets:` entry, with their defaults: each `field_*` key
# names a column; `prompt_format` says how the text fields are written and rendered (`chat`: a
# string or chat messages, in the chat template; `text`: text without the template; `auto`: text
# prompts as text, chat messages in the template, TRL's rule; `hh`: Anthropic HH transcripts, see
# `pofe.data.transcripts`); unset, it depends on the entry's type (`pofe.data.formats.RowFormat`).
# The config (`pofe.args.translate.FIELD_KEYS`) takes its list of keys from here.
DEFAULT_FIELDS = {
    "field_prompt": "prompt",
    "field_responses": "responses",
    "field_rewards": "rewards",
    "field_ranks": "ranks",
    "field_win_rates": "win_rates",
    "field_anchor_logps": "anchor_logps",
    "field_chosen": "chosen",
    "field_rejected": "rejected",
    "field_score_chosen": "score_chosen",
    "field_score_rejected": "score_rejected",
    "prompt_format": None,
}


def candidate_float_columns() -> tuple[str, ...]:
    """Per-candidate float columns carried through tokenisation and collation as (B, K)
    tensors: every registered method's label column, and the anchor's and pi_0's log-probs."""
    return (*label_columns(), ANCHOR_LOGPS, PI_0_LOGPS)


def tokenized_columns() -> tuple[str, ...]:
    """Tokenised row columns (what reaches the collator; not forward() arguments)."""
    return ("prompt_ids", "response_ids", *candidate_float_columns(), "row_id")


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
