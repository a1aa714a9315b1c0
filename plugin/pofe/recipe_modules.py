"""Where a recipe's own Python modules are found: the recipe's folder and the working directory.

A recipe names Python by import path (`judge.function: my_rewards:exact_answer`,
`judge.reward_funcs: [my_rewards.correct_answer]`), and the docs say a module beside the recipe,
or in the directory a command runs from, imports. `axolotl` runs as a console script, whose
import path holds neither (only `python -m`, as accelerate launches training, puts the working
directory on it), so `axolotl preprocess`, the stages of `axolotl pofe run` and `axolotl pofe
eval` could not import one. `PofePlugin.register`, which every command that loads a recipe
calls, records both (`add_recipe_dirs`) in `POFE_RECIPE_DIRS`, for this process and those it
starts (a run's stages, whose round recipes live in the run's folder, and their training
processes), whose own `register` adds theirs.

The folders are not put on Python's import path: there, a file beside the recipe would answer
every import of the process, and libraries probe optional packages by importing them (DeepSpeed
and transformers look for `apex`, `mlflow`, ...): a user's `mlflow.py` would be taken for the
package. A module the recipe names is imported by `import_recipe_module` alone, its folder on
the path only while it loads (its own imports of files beside it run then, at its top). Its
name must not be one Python already imports (the standard library's `json`, an installed
package's): the recipe would get that module, not the file beside it, so that is an error
naming both. A module found nowhere is an error naming the folders looked in, not a traceback.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from pofe.errors import PofeError

RECIPE_DIRS_ENV = "POFE_RECIPE_DIRS"


class RecipeModuleError(PofeError, ImportError):
    """A module the recipe names is found nowhere, or is named like one Python already imports."""


def add_recipe_dirs(config_path: str | Path | None) -> list[str]:
    """Record the folder of the recipe at `config_path` (None: no file), the working directory
    and the folders a parent process recorded, as the folders a recipe's modules are found in
    (`import_recipe_module`), here and in the processes this one starts. Returns the folders, in
    that order. The import path is left as it is."""
    here = [str(Path(config_path).resolve().parent)] if config_path else []
    dirs = list(dict.fromkeys([*here, os.getcwd(), *recipe_dirs()]))
    os.environ[RECIPE_DIRS_ENV] = os.pathsep.join(dirs)
    return dirs


def recipe_dirs() -> list[str]:
    """The folders recorded by `add_recipe_dirs` (in this process or a parent)."""
    return [d for d in os.environ.get(RECIPE_DIRS_ENV, "").split(os.pathsep) if d]


def _beside(top: str) -> Path | None:
    """The file of module `top` in the first recipe folder that holds one: `top.py`, or a
    package's `top/__init__.py`."""
    for folder in recipe_dirs():
        for candidate in (Path(folder) / f"{top}.py", Path(folder) / top / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


def _found_elsewhere(top: str) -> str | None:
    """Where Python's own import of `top` comes from (a file, or a built-in's name); None when
    it finds none."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # ValueError: a loaded module without a spec
        module = sys.modules.get(top)
        return getattr(module, "__file__", None) or (top if module else None)
    if spec is None:
        return None
    return spec.origin or next(iter(spec.submodule_search_locations or []), top)


def _folder_of(name: str, what: str) -> str | None:
    """The recorded folder module `name` loads from (None: Python's own import finds it, or
    finds none); `RecipeModuleError` when a file there is named like a module Python imports."""
    top = name.partition(".")[0]
    mine = _beside(top)
    if mine is None:
        return None
    other = _found_elsewhere(top)
    if other is not None and other not in ("built-in", "frozen") and Path(other).resolve() == mine:
        return None  # the same file: its folder is on the import path already
    if other is not None:
        raise RecipeModuleError(
            f"{what}: {mine} is named like the module {top!r} that Python already imports ({other}), which the "
            f"recipe would get instead of your file. Rename your file (e.g. to my_{top}) and the module in the "
            "recipe with it"
        )
    return str(mine.parent if mine.name != "__init__.py" else mine.parent.parent)


@contextmanager
def _on_path(folder: str | None) -> Iterator[None]:
    """`folder` last on the import path (the module's own imports still find installed packages
    first) while the block runs, then off it again."""
    if folder is None:
        yield
        return
    sys.path.append(folder)
    try:
        yield
    finally:
        del sys.path[len(sys.path) - 1 - sys.path[::-1].index(folder)]


def import_recipe_module(name: str, what: str = "the recipe") -> ModuleType:
    """Module `name` (dotted) as a recipe names it (`what`: the setting, for errors): the file
    beside the recipe or in a recorded folder (`recipe_dirs`), its folder on the import path
    only while it loads, then kept in `sys.modules` under its name; else Python's own (an
    installed module). `RecipeModuleError` when both exist: a file beside the recipe named like
    a standard or installed module, or when `name` is found nowhere (an import inside the module
    failing is the module's own error, raised as it is)."""
    try:
        with _on_path(_folder_of(name, what)):
            return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not (name == e.name or name.startswith(f"{e.name}.")):
            raise
        raise RecipeModuleError(_not_found(name, e.name, what)) from e


def _not_found(name: str, missing: str, what: str) -> str:
    """The error for module `name`, of which `missing` is found nowhere: the folders looked in
    and, for a top-level module, the nearest file name in them (a typo: `mymodul`)."""
    where = ", ".join(recipe_dirs()) or os.getcwd()
    message = (
        f"{what}: cannot import module {name!r}: no module {missing!r} in the recipe's folder or the working "
        f"directory ({where}), nor installed"
    )
    if "." not in missing:
        files = {p.stem for d in recipe_dirs() for p in Path(d).glob("*.py")}
        if near := difflib.get_close_matches(missing, sorted(files), n=1):
            message += f". Did you mean {near[0]!r} ({near[0]}.py)?"
    return message


def find_recipe_module(name: str, what: str = "the recipe") -> ModuleSpec | None:
    """`importlib.util.find_spec` of module `name` as `import_recipe_module` would import it."""
    with _on_path(_folder_of(name, what)):
        return importlib.util.find_spec(name)


__all__ = [
    "RECIPE_DIRS_ENV",
    "RecipeModuleError",
    "add_recipe_dirs",
    "find_recipe_module",
    "import_recipe_module",
    "recipe_dirs",
]
