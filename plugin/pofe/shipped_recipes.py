"""The recipes POFE ships: package data in `pofe/recipes/`, so a wheel holds them too.

The repository's top-level `recipes/` is a link to that folder. `axolotl pofe recipes` lists
them and copies one, with the DeepSpeed config it names, to a folder (`recipes/` by default);
`python -m pofe.demo` runs the tiny ones from here. A recipe names its DeepSpeed config by a
path relative to the directory a run starts in (`deepspeed: recipes/deepspeed/zero3_bf16.json`),
so a copy into `recipes/` runs as the README's commands say, and a copy elsewhere names its
copied config.

A copy never writes through a symbolic link: a target that is a link (to a user's file, or
dangling: its target would be created wherever it points) is refused, naming it; `--force`
replaces the link itself with the shipped file, and what it pointed to stays as it was. Each
file is written whole or not at all (`pofe.files.write_atomic`); a folder that cannot be
written is named, with what to do.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from pofe.errors import PofeError
from pofe.files import WriteFailed, write_atomic

FOLDER = Path(__file__).resolve().parent / "recipes"
# where a copy goes unless told: the folder the shipped recipes' DeepSpeed paths start with
DEFAULT_DESTINATION = Path("recipes")


class RecipeCopyError(PofeError, ValueError):
    """An unknown recipe name, a copy that would overwrite a different file or write through a
    link, or a folder that cannot be written."""


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
    """Why `target` needs no write (None: it does); raises when it holds a different file, or
    is a link, and not `force` (then the write replaces the file, or the link itself)."""
    link = target.is_symlink()
    if not target.exists() and not link:
        return None
    if target.resolve() == source.resolve():
        return "the shipped file itself"
    if target.is_dir():
        raise RecipeCopyError(
            f"{target} is a folder, where the shipped {source.name} would go: move it, or copy --to another folder"
        )
    if target.is_file() and _read(target) == text:
        return "already there, unchanged"
    if force:
        return None
    if link:
        raise _through_link(target, f"the shipped {source.name}")
    raise RecipeCopyError(f"{target} exists and differs from the shipped {source.name}: --force replaces it")


def _through_link(link: Path, replacement: str) -> RecipeCopyError:
    """The refusal to write through `link`; --force puts `replacement` in its place."""
    return RecipeCopyError(
        f"{link} is a symbolic link to {os.readlink(link)}"
        + ("" if link.exists() else " (which does not exist)")
        + f": a copy never writes through a link. --force replaces the link itself with {replacement}, "
        "leaving what it points to as it is"
    )


def _linked_folder(destination: Path, target: Path) -> Path | None:
    """The first folder between `destination` and `target` (`deepspeed/`) that is a symbolic link."""
    folder = destination
    for part in target.relative_to(destination).parts[:-1]:
        folder = folder / part
        if folder.is_symlink():
            return folder
    return None


def _read(target: Path) -> str:
    """`target`'s text, to compare with the shipped file; a clear error when it cannot be read."""
    try:
        return target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise RecipeCopyError(
            f"cannot read {target} to compare it with the shipped file: {why}. Move it, or copy --to another folder"
        ) from e


def copy_recipe(name: str, destination: Path = DEFAULT_DESTINATION, force: bool = False) -> list[str]:
    """Copy the shipped recipe `name`, and the DeepSpeed config it names, into `destination`.

    The config goes to `destination/deepspeed/`; outside `recipes/` the copy's `deepspeed:`
    line names it there (relative to the directory a run starts in, as the recipe's own path).
    Nothing is written when a target holds a different file or is a symbolic link, unless
    `force` (which replaces the file, or the link itself: never what a link points to).
    Returns one line per file: where it went.
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
    for (_, target, _), state in zip(files, states):
        linked = _linked_folder(destination, target) if state is None else None
        if linked and not force:
            raise _through_link(linked, "a folder")
    done = []
    for (_, target, content), state in zip(files, states):
        if state is None:
            if linked := _linked_folder(destination, target):
                linked.unlink()  # --force: the link itself, not the folder it points to
            try:
                write_atomic(target, content)  # os.replace: a link at `target` is replaced, not followed
            except WriteFailed as e:
                before = f" ({', '.join(done)} written before it)" if done else ""
                raise RecipeCopyError(f"{e} Or copy into a folder you can write: --to DIR{before}.") from e
        done.append(f"{target}" + (f" ({state})" if state else ""))
    return done
