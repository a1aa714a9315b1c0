"""Where a recipe's own Python modules are found: the recipe's folder and the working directory.

A recipe names Python by import path (`judge.function: my_rewards:exact_answer`,
`judge.reward_funcs: [my_rewards.correct_answer]`), and the docs say a module beside the recipe,
or in the directory a command runs from, imports. `axolotl` runs as a console script, whose
import path holds neither (only `python -m`, as accelerate launches training, puts the working
directory on it), so `axolotl preprocess`, the stages of `axolotl pofe run` and `axolotl pofe
eval` could not import one. `PofePlugin.register`, which every command that loads a recipe
calls, adds both here, and records them in `POFE_RECIPE_DIRS` for the processes it starts (a
run's stages, whose round recipes live in the run's folder, and their training processes),
whose own `register` adds them too.

The folders go at the end of the import path: a module beside the recipe never shadows an
installed package of the same name (a `datasets.py` there must not replace Hugging Face's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

RECIPE_DIRS_ENV = "POFE_RECIPE_DIRS"


def add_recipe_dirs(config_path: str | Path | None) -> list[str]:
    """Put the folder of the recipe at `config_path` (None: no file), the working directory and
    the folders a parent process recorded at the end of `sys.path`; record them for children.
    Returns the folders, in that order."""
    inherited = [d for d in os.environ.get(RECIPE_DIRS_ENV, "").split(os.pathsep) if d]
    here = [str(Path(config_path).resolve().parent)] if config_path else []
    dirs = list(dict.fromkeys([*here, os.getcwd(), *inherited]))
    sys.path.extend(d for d in dirs if d not in sys.path)
    os.environ[RECIPE_DIRS_ENV] = os.pathsep.join(dirs)
    return dirs


__all__ = ["RECIPE_DIRS_ENV", "add_recipe_dirs"]
