"""Refuse `$VAR`, `${VAR}` and `~` in a recipe's paths, which axolotl reads as written.

Axolotl expands neither environment variables nor `~`: `base_model: ${HOME}/models/x` names a
folder literally called `${HOME}`, and fails later as an unknown hub repo id, an unrelated
message. POFE does not expand them either, so a recipe means the same with and without the
plugin; it says so at load, with the path the shell would have meant. A path that exists as
written (a folder really named `$x`) passes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

# axolotl's keys that name local paths (or hub ids), and the `pofe:` ones
PATH_KEYS = (
    "base_model",
    "base_model_config",
    "tokenizer_config",
    "lora_model_dir",
    "output_dir",
    "dataset_prepared_path",
)
_UNEXPANDED = re.compile(r"\$\{?[A-Za-z_]\w*\}?|^~")


def check_unexpanded_paths(cfg: dict[str, Any]) -> None:
    """Raise ValueError naming the first path key whose value holds `$VAR`, `${VAR}` or a leading `~`."""
    pofe = cfg.get("pofe") if isinstance(cfg.get("pofe"), dict) else {}
    named = [(key, cfg.get(key)) for key in PATH_KEYS]
    named += [
        (f"datasets[{i}].path", e.get("path")) for i, e in enumerate(cfg.get("datasets") or []) if isinstance(e, dict)
    ]
    named += [
        (f"pofe.{block}.model", (pofe.get(block) or {}).get("model"))
        for block in ("generate", "judge")
        if isinstance(pofe.get(block), dict)
    ]
    for key, value in named:
        if isinstance(value, str) and _UNEXPANDED.search(value) and not Path(value).exists():
            meant = os.path.expanduser(os.path.expandvars(value))
            raise ValueError(
                f"{key}: {value!r} holds an environment variable or '~', which axolotl does not expand: it "
                f"would name a path with those characters in it. Write the path out"
                f"{f' (here: {meant!r})' if meant != value else ''}."
            )
