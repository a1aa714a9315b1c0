"""`PofeError`: the base of POFE's own errors.

Each error says what was wrong and what to do, so `axolotl pofe ...` shows its message
alone, not a traceback (`pofe.cli`). Each subclass also keeps the builtin it refines
(`ValueError` for bad input, `RuntimeError` for a state POFE cannot go on from), so code
that catches those still does.

This module is a leaf: standard library only (and `pofe.compat`).
"""

import os

from pofe.compat import chain_excepthook


class PofeError(Exception):
    """An error POFE raises on purpose, its message written for the user."""


# Set by `axolotl pofe run` for each stage process (`pofe.run.rounds.processes`): the file a
# POFE error's message goes to, so the runner shows that message, not the stage's traceback.
ERROR_FILE_ENV = "POFE_ERROR_FILE"


def record_error(error: BaseException) -> None:
    """Write a PofeError's message to `$POFE_ERROR_FILE` when the variable is set (in a stage
    of `axolotl pofe run`); anything else, or no variable, writes nothing."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or not isinstance(error, PofeError):
        return
    tmp = f"{path}.{os.getpid()}.tmp"  # every rank of a stage may write it: each whole, the last one stays
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(str(error))
    os.replace(tmp, path)


def record_uncaught_errors() -> None:
    """In a stage process, an uncaught PofeError is also written by `record_error` before
    Python prints its traceback (which stays in the stage's log). Installed once; a no-op
    outside `axolotl pofe run`'s stages."""
    if ERROR_FILE_ENV in os.environ:
        chain_excepthook(record_error, marker="records_pofe_errors")
