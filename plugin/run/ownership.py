"""Which output_dir an iterated run may write into, and which files in it are POFE's.

`axolotl pofe run` writes its layout (`pofe.run.layout`) into the recipe's output_dir and
later replaces or deletes some of its own files (a stale `eval/eval.json`, old
`report-*.png`). Into a folder that holds files but no POFE run (no `pofe-run.json` or
`pofe-run.lock`) it would overwrite and delete someone else's, so such a folder is refused
(`claim_output_dir`) unless the recipe sets `pofe.overwrite_output_dir: true`. Then the
files found there are recorded in `pofe-preexisting.json`, and `pofe_wrote` is False for
them: POFE overwrites a same-named file (what the key asks for) but deletes none.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pofe.files import write_atomic

from .layout import RunLayout

PREEXISTING_NAME = "pofe-preexisting.json"
SHOWN = 5  # entries named in the refusal
# axolotl's log of a recipe's load, which it writes into output_dir (replacing one there)
# whenever the recipe is loaded, before POFE can look: a folder holding only it is new
AXOLOTL_LOG = "debug.log"
AXOLOTL_OUTPUT_DIR = "./model-out"  # axolotl's default output_dir


class OutputDirRefused(ValueError):
    """The output_dir is a file, or a folder of files that is no POFE run's (a ValueError:
    `axolotl pofe run` shows it as an error message, not a traceback)."""


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _files(root: Path) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns]} of every file under root."""
    return {str(p.relative_to(root)): _stamp(p) for p in sorted(root.rglob("*")) if p.is_file()}


def claim_output_dir(layout: RunLayout, overwrite: bool, echo: Callable[[str], None]) -> None:
    """Refuse an output_dir that is a file, or a non-empty folder that is no POFE run
    (unless `overwrite`: then record the files found there)."""
    root = layout.root
    if root.exists() and not root.is_dir():
        raise OutputDirRefused(
            f"output_dir {root} is a file, not a folder: `axolotl pofe run` keeps a run's rounds, "
            "state and report in a folder there. Set output_dir to a new folder's path.")
    if not root.is_dir() or layout.state.exists() or layout.lock.exists() or (root / PREEXISTING_NAME).exists():
        return  # new, or a run of POFE's (one killed before its state was written holds the lock)
    found = {f: stamp for f, stamp in _files(root).items() if f != AXOLOTL_LOG}
    entries = sorted(p.name for p in root.iterdir() if p.name != AXOLOTL_LOG)
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:SHOWN]) + (f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else "")
        raise OutputDirRefused(
            f"output_dir {root} holds {len(found)} files but no POFE run ({shown}): a run writes "
            "prompts/, round-<t>/, eval/ and report.md there, and would overwrite or delete files of "
            "those names. Use a new output_dir, or set pofe.overwrite_output_dir: true to write "
            "among them (same-named files are overwritten; none found there is deleted).")
    write_atomic(root / PREEXISTING_NAME, json.dumps({"files": found}, indent=2) + "\n")
    echo(f"pofe.overwrite_output_dir: writing into {root}, which holds {len(found)} files of no POFE run "
         f"(listed in {root / PREEXISTING_NAME}: overwritten when a run writes the same name, never deleted)")


def claim_recipe_output_dir(recipe_path: str | Path, echo: Callable[[str], None]) -> None:
    """`claim_output_dir` for the recipe's output_dir, read from its YAML: before axolotl
    loads the recipe, which already writes debug.log there."""
    import yaml
    from pydantic import TypeAdapter

    raw = yaml.safe_load(Path(recipe_path).read_text()) or {}
    overwrite = TypeAdapter(bool).validate_python((raw.get("pofe") or {}).get("overwrite_output_dir", False))
    claim_output_dir(RunLayout(Path(raw.get("output_dir") or AXOLOTL_OUTPUT_DIR).resolve()), overwrite, echo)


def pofe_wrote(layout: RunLayout, path: Path) -> bool:
    """False for a file that was in the output_dir before its run started there and that POFE
    has not rewritten since (same size and modification time): one POFE must neither delete
    as its own stale output nor read as its own."""
    record = layout.root / PREEXISTING_NAME
    path = Path(path)
    if not record.is_file() or not path.is_file():
        return True
    found = json.loads(record.read_text())["files"].get(str(path.resolve().relative_to(layout.root.resolve())))
    return found != _stamp(path)
