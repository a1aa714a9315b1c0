"""A recipe's own judge functions (`judge.function: module:function`, `judge.reward_funcs`),
imported from the recipe's folder, the working directory or the installed packages, with an
error that says what is missing or broken and where."""

from __future__ import annotations

import ast
import difflib
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pofe.errors import PofeError
from pofe.recipe_modules import RecipeModuleError, import_recipe_module


class MissingFunction(PofeError, AttributeError):
    """The module a recipe names has no function of the name it gives: a typo in the recipe."""


class BrokenJudgeModule(PofeError, ImportError):
    """The module a recipe names fails as it imports (a syntax error, an error at its top level)."""


class NotAFunction(PofeError, TypeError):
    """The name a recipe gives in its module is something other than a function."""


def load_function(spec: str) -> Callable[..., Any]:
    """'package.module:function' -> the function, with an error that says what is missing."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"judge.function must look like 'module:function', got {spec!r}")
    return _import_callable(module_name, attr, f"judge.function {spec!r}")


def load_dotted(path: str, key: str) -> Callable[..., Any]:
    """'package.module.function' (TRL / axolotl's reward_funcs spelling) -> the function;
    `key` names the setting in errors."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{key} must look like 'package.module.function', got {path!r}")
    return _import_callable(module_name, attr, f"{key} {path!r}")


def _import_callable(module_name: str, attr: str, what: str) -> Callable[..., Any]:
    """The callable `attr` of the module a recipe names: beside the recipe, in the working
    directory, or installed (`pofe.recipe_modules.import_recipe_module`)."""
    try:
        module = import_recipe_module(module_name, what)
    except RecipeModuleError:
        raise
    except Exception as e:  # the module's own failure: where it failed, not a traceback through importlib
        raise BrokenJudgeModule(
            f"{what}: module {module_name!r} fails as it imports, at {_where_raised(e)}: {type(e).__name__}: "
            f"{getattr(e, 'msg', None) or e}. Fix the module there (`python -c 'import {module_name}'` in the "
            "recipe's folder shows the same)"
        ) from e
    try:
        fn = getattr(module, attr)
    except AttributeError as e:
        near = difflib.get_close_matches(attr, [n for n in dir(module) if not n.startswith("_")], n=1)
        hint = f". Did you mean {near[0]!r}?" if near else ""
        raise MissingFunction(f"{what}: module {module_name!r} has no attribute {attr!r}{hint}") from e
    if not callable(fn):
        raise NotAFunction(
            f"{what}: {module_name}.{attr} ({_defined_at(module, attr)}) is {type(fn).__name__} {fn!r:.60}, not a "
            "function: point the recipe at the function that judges, or define it there"
        )
    return fn


def _where_raised(error: BaseException) -> str:
    """'file, line n' of an import's failure: a syntax error's own place, else the innermost frame
    that is no part of importlib's machinery."""
    if isinstance(error, SyntaxError):
        return f"{error.filename}, line {error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
    return f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else "its top level"


def _defined_at(module, attr: str) -> str:
    """'file, line n' where `module` assigns `attr` at its top level, else its file."""
    file = getattr(module, "__file__", None) or module.__name__
    try:
        tree = ast.parse(Path(file).read_text())
    except (OSError, SyntaxError, ValueError):
        return file
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
            return f"{file}, line {node.lineno}"
    return file
