"""Log-prob tables per (row, candidate) for SPPO: the anchor pi_t and pi_0.

`AnchorLogps` (`logps`): what the trainer looks up, the anchor's table and, with
`pofe.anchor_mix`, pi_0's; `pi_0`: which pass gives pi_0's log-probs, and the pass that loads
pi_0 apart before the policy loads; `table`: the pass itself and the cache both share.
"""

from pofe.anchor.logps import AnchorLogps
from pofe.anchor.table import RowScorer, load_table, nonfinite_rows, row_order, row_tokens, rows_digest, score_rows

__all__ = [
    "AnchorLogps",
    "RowScorer",
    "load_table",
    "nonfinite_rows",
    "row_order",
    "row_tokens",
    "rows_digest",
    "score_rows",
]
