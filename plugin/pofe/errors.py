"""`PofeError`: the base of POFE's own errors.

Each error says what was wrong and what to do, so `axolotl pofe ...` shows its message
alone, not a traceback (`pofe.cli`), and so do `axolotl train` and `axolotl preprocess`
(`show_pofe_errors`, installed by the plugin). Each subclass also keeps the builtin it refines
(`ValueError` for bad input, `RuntimeError` for a state POFE cannot go on from), so code
that catches those still does.

This module is a leaf: standard library only (and `pofe.compat`).
"""

import contextlib
import os
import sys

from pofe.compat.excepthook import chain_excepthook


class PofeError(Exception):
    """An error POFE raises on purpose, its message written for the user."""


# Set by `axolotl pofe run` for each stage process (`pofe.run.rounds.processes`): the file a
# POFE error's message goes to, so the runner shows that message, not the stage's traceback.
ERROR_FILE_ENV = "POFE_ERROR_FILE"


def record_error(error: BaseException) -> None:
    """Write a PofeError's message to `$POFE_ERROR_FILE` when the variable is set (in a stage
    of `axolotl pofe run`); anything else, or no variable, writes nothing. A write that fails
    leaves no file behind and says so on stderr (the error itself goes on to be shown)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or not isinstance(error, PofeError):
        return
    tmp = f"{path}.{os.getpid()}.tmp"  # every rank of a stage may write it: each whole, the last one stays
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(str(error))
        os.replace(tmp, path)
    except OSError as e:  # a full disk: the message still reaches the stage's log, not a half file
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        sys.stderr.write(f"POFE: could not write this error's message to {path} for `axolotl pofe run`: {e}\n")


# What `show_pofe_errors` was last told: where tracebacks go, and whether `--debug` shows them
_SHOWN: dict[str, object] = {"traceback_log": None, "debug": False}


def show_pofe_errors(traceback_log: str | None = None, debug: bool = False) -> None:
    """An uncaught PofeError ends this process's output with its message alone (installed
    once through `pofe.compat.excepthook.chain_excepthook`, its settings updated at each call).

    In `axolotl train` or `axolotl preprocess`: the message goes to stderr, the traceback to
    `traceback_log` (axolotl's `<output_dir>/debug.log`, which also holds the run's whole
    output; a file in the temporary folder when that folder does not exist yet, as when the
    recipe itself is refused), named under the message. `debug` (axolotl's `--debug`) prints
    the traceback as Python would. In a stage of `axolotl pofe run` the error goes to the runner
    (`record_error`) and the traceback to the stage's log, which holds the stage's output.
    Any other exception is printed as Python would.
    """
    _SHOWN.update(traceback_log=traceback_log, debug=debug)
    chain_excepthook(_show_pofe_error, marker="shows_pofe_errors")


def _show_pofe_error(kind, value, tb) -> bool:
    """Record the error for the runner; a PofeError outside a stage and without `--debug` is
    shown as its message (True), anything else is left to Python's hook (False)."""
    record_error(value)
    if not isinstance(value, PofeError) or _SHOWN["debug"] or ERROR_FILE_ENV in os.environ:
        return False
    where = _write_traceback(kind, value, tb)
    sys.stderr.write(f"Error: {value}\n(the traceback: {where}; `--debug` prints it here)\n")
    sys.stderr.flush()
    return True


def _write_traceback(kind, value, tb) -> str:
    """Append the traceback to the log `show_pofe_errors` was given (or a new temporary file); its path."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(kind, value, tb))
    log = _SHOWN["traceback_log"]
    if not log or not os.path.isdir(os.path.dirname(os.path.abspath(log))):
        handle, log = tempfile.mkstemp(prefix="pofe-error-", suffix=".log")
        os.close(handle)
    sys.stdout.flush()  # what the process printed before goes first in a log it shares
    sys.stderr.flush()
    with open(log, "a", encoding="utf-8") as f:
        f.write(text)
    return log
