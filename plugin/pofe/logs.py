"""POFE's loggers, named as an axolotl integration's: `axolotl.integrations.pofe.*`.

axolotl's CLI (`axolotl.logging_config`) shows INFO only from `axolotl.*` loggers and
drops every other logger's INFO where it is emitted. Under axolotl's namespace POFE's own
INFO lines (the candidate summary, the anchor cache) show beside axolotl's, through its
handlers and at its level (`AXOLOTL_LOG_LEVEL`), with no logging set up here. Without
axolotl's CLI the names are ordinary loggers that propagate to the root.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

# How a command says one line to its user (`click.echo`, `print`, a test's list.append).
Echo = Callable[[str], None]


def logger_name(module: str) -> str:
    """The logger name for a POFE module; `pofe_candidates`, which runs without axolotl
    in a vLLM-only venv, takes `logging.getLogger(logger_name(__name__))`."""
    return f"axolotl.integrations.{module}"


def get_logger(module: str):
    """axolotl's main-process logger for a training-side module: `get_logger(__name__)`."""
    # imported here so that this module stays importable without axolotl
    from axolotl.utils.logging import get_logger as axolotl_logger

    return axolotl_logger(logger_name(module))


class RedactingFilter(logging.Filter):
    """Passes each record on with its message rewritten by `redact`."""

    def __init__(self, redact: Callable[[str], str]):
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redact(record.getMessage()), None
        return True


def redact_logger(name: str, redact: Callable[[str], str]) -> None:
    """Every record of logger `name` rewritten by `redact` before any handler sees it (once)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter(redact))
