"""Python's process-wide excepthook."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pofe.compat.registry import entry


@entry(
    reaches="Python: sys.excepthook, replaced process-wide by a hook that may pass to the one before it",
    names=("excepthook",),
    written_for="Python 3.11, 3.12",
    goes_when="axolotl's CLI hands a plugin's uncaught errors to the plugin (then `pofe.errors` shows them there)",
)
def chain_excepthook(handle: Callable[[type, BaseException, Any], bool], marker: str) -> None:
    """Give every uncaught error to `handle(kind, error, traceback)` first; the `sys.excepthook`
    before it still runs unless `handle` returns True (it showed the error itself). Once per
    process (`marker` names the hook's attribute that says it is installed)."""
    if getattr(sys.excepthook, marker, False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        if not handle(kind, value, traceback):
            previous(kind, value, traceback)

    setattr(hook, marker, True)
    sys.excepthook = hook
