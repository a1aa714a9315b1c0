"""`PofeError`: the base of POFE's own errors.

Each error says what was wrong and what to do, so `axolotl pofe ...` shows its message
alone, not a traceback (`pofe.cli`). Each subclass also keeps the builtin it refines
(`ValueError` for bad input, `RuntimeError` for a state POFE cannot go on from), so code
that catches those still does.

This module is a leaf: standard library only.
"""


class PofeError(Exception):
    """An error POFE raises on purpose, its message written for the user."""
