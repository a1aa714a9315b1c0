"""The recipes POFE ships: package data in `pofe/recipes/`, so a wheel holds them too.

The repository's top-level `recipes/` is a link to that folder. `axolotl pofe recipes` lists
them and copies one, with the DeepSpeed config it names, to a folder (`recipes/` by default);
`python -m pofe.demo` runs the tiny ones from here. A recipe names its DeepSpeed config by a
path relative to the directory a run starts in (`deepspeed: recipes/deepspeed/zero3_bf16.json`),
so a copy into `recipes/` runs as the README's commands say, and a copy elsewhere names its
copied config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from pofe.errors import PofeError

FOLDER = Path(__file__).resolve().parent / "recipes"
# where a copy goes unless told: the folder the shipped recipes' DeepSpeed paths start with
DEFAULT_DESTINATION = Path("recipes")


class RecipeCopyError(PofeError, ValueError):
    """An unknown recipe name, or a copy that would overwrite a different file."""


@dataclass(frozen=True)
class ShippedRecipe:
    name: str  # the file's stem: `sppo-qlora`
    path: Path
    summary: str  # the first sentence of its leading comment
    deepspeed: str | None  # its `deepspeed:` value, a path under DEFAULT_DESTINATION


def _summary(text: str) -> str:
    """The leading comment's first clause: up to the first ': ' or '. ' outside parentheses (a
    citation's "(Munos et al. 2023)" is part of it), or its end."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("# ") or line.startswith("#  "):
            break
        lines.append(line[2:].strip())
    first = " ".join(lines)
    depth = 0
    for i, (char, after) in enumerate(zip(first, first[1:] + " ", strict=True)):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ":." and after.isspace():
            return first[:i]
    return first.rstrip(".")


def shipped() -> list[ShippedRecipe]:
    """Every shipped recipe, by name."""
    out = []
    for path in sorted(FOLDER.glob("*.yml")):
        text = path.read_text(encoding="utf-8")
        deepspeed = (yaml.safe_load(text) or {}).get("deepspeed")
        out.append(ShippedRecipe(path.stem, path, _summary(text), deepspeed))
    return out


def find(name: str) -> ShippedRecipe:
    """The shipped recipe `name` (with or without `.yml`)."""
    stem = name.removesuffix(".yml")
    recipes = shipped()
    for recipe in recipes:
        if recipe.name == stem:
            return recipe
    raise RecipeCopyError(
        f"no shipped recipe {name!r}; POFE ships {', '.join(r.name for r in recipes)} "
        "(`axolotl pofe recipes` lists them)"
    )


def _state(source: Path, target: Path, text: str, force: bool) -> str | None:
    """Why `target` needs no write (None: it does); raises when it holds a different file and not `force`."""
    if not target.exists():
        return None
    if target.resolve() == source.resolve():
        return "the shipped file itself"
    if target.read_text(encoding="utf-8") == text:
        return "already there, unchanged"
    if not force:
        raise RecipeCopyError(f"{target} exists and differs from the shipped {source.name}: --force replaces it")
    return None


def copy_recipe(name: str, destination: Path = DEFAULT_DESTINATION, force: bool = False) -> list[str]:
    """Copy the shipped recipe `name`, and the DeepSpeed config it names, into `destination`.

    The config goes to `destination/deepspeed/`; outside `recipes/` the copy's `deepspeed:`
    line names it there (relative to the directory a run starts in, as the recipe's own path).
    Nothing is written when a target holds a different file, unless `force`. Returns one line
    per file: where it went.
    """
    recipe = find(name)
    text = recipe.path.read_text(encoding="utf-8")
    files = []  # (source, target, text)
    if recipe.deepspeed:
        inside = Path(recipe.deepspeed).relative_to(DEFAULT_DESTINATION)  # the shipped ones all lie there
        copied = destination / inside
        files.append((FOLDER / inside, copied, (FOLDER / inside).read_text(encoding="utf-8")))
        line = re.compile(rf"^deepspeed:[ \t]*{re.escape(recipe.deepspeed)}[ \t]*$", re.M)
        text, count = line.subn(f"deepspeed: {copied.as_posix()}", text)
        assert count == 1, f"{recipe.path.name}: one `deepspeed:` line expected, found {count}"
    files.insert(0, (recipe.path, destination / recipe.path.name, text))
    states = [_state(*file, force) for file in files]  # every check before any write
    done = []
    for (_, target, content), state in zip(files, states):
        if state is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        done.append(f"{target}" + (f" ({state})" if state else ""))
    return done
