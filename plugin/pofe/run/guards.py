"""What a run checks before it writes into its output_dir, or trusts what is there.

One runner per output_dir (`RunLock`, `<output_dir>/pofe-run.lock`), and no evaluation or report
of a run while it runs (`holding_run`): `axolotl pofe eval` and `report` read every round's
files, and while a round trains they would read it half-done. An OS lock (`pofe.locks`), so a
holder that crashes never blocks the next run. Stages inherit it
(`pofe.run.rounds.processes.run_logged`'s `keep_fds`), so a trainer that outlives its runner still
holds it.

Which output_dir a run may write into, and which files in it are POFE's (`claim_output_dir`,
`pofe_wrote`). `axolotl pofe run` writes its files (`pofe.run.folder`) into the recipe's output_dir and
later replaces or deletes some of its own files (a stale `eval/eval.json`, old
`report-*.png`). Into a folder that holds files but no POFE run (no `pofe-run.json` or
`pofe-run.lock`) it would overwrite and delete someone else's, so such a folder is refused
(`claim_output_dir`) unless the recipe sets `pofe.overwrite_output_dir: true`. Then the
files found there are recorded in `pofe-preexisting.json`, and `pofe_wrote` is False for
them: POFE overwrites a same-named file (what the key asks for) but deletes none.

What a restart checks before it trusts a finished stage: that its inputs did not change and
its output is still there.

- The prompt files (`check_prompt_sources`): the `prompts` stage copies the recipe's prompt
  dataset into `prompts/round-<t>.jsonl` once. A prompt file replaced afterwards would be
  ignored by every later round, so its sha256 is recorded at that stage, and a restart
  with another file stops, naming it.
- A round's candidates (`redo_damaged_stages`): data.jsonl is checked against the sha256
  its stage recorded; a damaged one is rebuilt from the shards by preprocessing again.
- A round's merged model (`redo_damaged_stages`): the next round loads `round-<t>/merged`. When
  it is gone (deleted to save space) while the state says merged, the merge stage runs
  again from the round's adapter, instead of every later start failing on a missing model.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pofe.compat.axolotl_internals import AXOLOTL_DEBUG_LOG
from pofe.errors import PofeError
from pofe.files import write_atomic
from pofe.locks import FolderLock, describe, here_and_gone
from pofe.logs import Echo
from pofe.run.folder import RunFolder, RunState, RunStateMismatch
from pofe.training_log import LOCK_FD_ENV  # the run's lock, inherited by each stage it starts


class RunLocked(PofeError, RuntimeError):
    """Another runner (or a stage it started) holds the output_dir."""


# What the holder was started as, in its record and the refusal (a record without one is a runner's)
RUN, EVAL, REPORT = "axolotl pofe run", "axolotl pofe eval", "axolotl pofe report"
# Why a second command may not share the folder with the holder, by what the second one is
_WHY = {
    RUN: "two commands writing one output_dir would overwrite each other's files",
    EVAL: "an evaluation read now would take a round that is still training as finished",
    REPORT: "a report read now would take a round that is still training as finished",
}


def _locked_message(path: Path, holder: dict, command: str) -> str:
    held_by = holder.get("command", RUN)
    if here_and_gone(holder):
        return (
            f"{path.parent} is locked by a stage process of an `{held_by}` that has ended "
            f"({describe(holder)}); the stage is being stopped. Wait for it to exit "
            f"(`fuser -v {path}` lists it), then run again."
        )
    stop = f" (kill {holder['pid']})" if holder.get("host") == socket.gethostname() else ""
    another = "another " if held_by == command else ""
    return (
        f"{path.parent} is in use by {another}`{held_by}` ({describe(holder)}); {_WHY[command]}. "
        f"Wait for it to finish, or stop it{stop}, then run `{command}` again."
    )


class RunLock(FolderLock):
    """A run's output_dir held by one command (`RUN`, `EVAL`, `REPORT`); `RunLocked` for another."""

    @classmethod
    def acquire(cls, path: Path, echo: Echo, command: str = RUN) -> RunLock:
        return super().acquire(path, echo, command, lambda holder: RunLocked(_locked_message(path, holder, command)))


def _inherited(path: Path) -> bool:
    """Whether this process holds `path`'s lock from the runner that started it (`LOCK_FD_ENV`)."""
    fd = os.environ.get(LOCK_FD_ENV)
    try:
        held, here = os.fstat(int(fd)), os.stat(path)
    except (TypeError, ValueError, OSError):
        return False
    return (held.st_dev, held.st_ino) == (here.st_dev, here.st_ino)


@contextmanager
def holding_run(folder: RunFolder, echo: Echo, command: str) -> Iterator[None]:
    """Hold `folder`'s lock while `command` (`EVAL`, `REPORT`) reads and writes it: refused
    (`RunLocked`, naming the holder) while a run, or another evaluation, holds it. The
    runner's own eval stage inherits the runner's lock and goes on under it; a folder not yet
    made holds nothing to guard."""
    if _inherited(folder.lock) or not folder.root.is_dir():
        yield
        return
    with RunLock.acquire(folder.lock, echo, command):
        yield


PREEXISTING_NAME = "pofe-preexisting.json"
SHOWN = 5  # entries named in the refusal
# axolotl's log of a recipe's load, which it writes into output_dir (replacing one there)
# whenever the recipe is loaded, before POFE can look: a folder holding only it is new
AXOLOTL_LOG = AXOLOTL_DEBUG_LOG
AXOLOTL_OUTPUT_DIR = "./model-out"  # axolotl's default output_dir


class OutputDirRefused(PofeError, ValueError):
    """The output_dir is a file, or a folder of files that is no POFE run's."""


def _stamp(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _files(root: Path) -> dict[str, list[int]]:
    """{relative path: [size, mtime_ns]} of every file under root."""
    return {str(p.relative_to(root)): _stamp(p) for p in sorted(root.rglob("*")) if p.is_file()}


def claim_output_dir(folder: RunFolder, overwrite: bool, echo: Callable[[str], None]) -> None:
    """Refuse an output_dir that is a file, or a non-empty folder that is no POFE run
    (unless `overwrite`: then record the files found there)."""
    root = folder.root
    if root.exists() and not root.is_dir():
        raise OutputDirRefused(
            f"output_dir {root} is a file, not a folder: `axolotl pofe run` keeps a run's rounds, "
            "state and report in a folder there. Set output_dir to a new folder's path."
        )
    if not root.is_dir() or folder.state.exists() or folder.lock.exists() or (root / PREEXISTING_NAME).exists():
        return  # new, or a run of POFE's (one killed before its state was written holds the lock)
    # what loading the recipe writes before the run's state exists: axolotl's log and the runner's
    loading = (AXOLOTL_LOG, folder.runner_log.name)
    found = {f: stamp for f, stamp in _files(root).items() if f not in loading}
    entries = sorted(p.name for p in root.iterdir() if p.name not in loading)
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:SHOWN]) + (f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else "")
        raise OutputDirRefused(
            f"output_dir {root} holds {len(found)} files but no POFE run ({shown}): a run writes "
            "prompts/, round-<t>/, eval/ and report.md there, and would overwrite or delete files of "
            "those names. Use a new output_dir, or set pofe.overwrite_output_dir: true to write "
            "among them (same-named files are overwritten; none found there is deleted)."
        )
    write_atomic(root / PREEXISTING_NAME, json.dumps({"files": found}, indent=2) + "\n")
    echo(
        f"pofe.overwrite_output_dir: writing into {root}, which holds {len(found)} files of no POFE run "
        f"(listed in {root / PREEXISTING_NAME}: overwritten when a run writes the same name, never deleted)"
    )


def claim_recipe_output_dir(
    recipe_path: str | Path, echo: Callable[[str], None], overrides: dict | None = None
) -> RunFolder:
    """`claim_output_dir` for the recipe's output_dir, read from its YAML (or the command line's
    `--output-dir`): before axolotl loads the recipe, which already writes debug.log there.
    Returns the run's folder."""
    import yaml
    from pydantic import TypeAdapter

    raw = {**(yaml.safe_load(Path(recipe_path).read_text()) or {}), **(overrides or {})}
    overwrite = TypeAdapter(bool).validate_python((raw.get("pofe") or {}).get("overwrite_output_dir", False))
    folder = RunFolder(Path(raw.get("output_dir") or AXOLOTL_OUTPUT_DIR).resolve())
    claim_output_dir(folder, overwrite, echo)
    return folder


def pofe_wrote(folder: RunFolder, path: Path) -> bool:
    """False for a file that was in the output_dir before its run started there and that POFE
    has not rewritten since (same size and modification time): one POFE must neither delete
    as its own stale output nor read as its own."""
    record = folder.root / PREEXISTING_NAME
    path = Path(path)
    if not record.is_file() or not path.is_file():
        return True
    found = json.loads(record.read_text())["files"].get(str(path.resolve().relative_to(folder.root.resolve())))
    return found != _stamp(path)


def prompt_sources(cfg, pcfg) -> dict[str, str]:
    """{path: sha256} of the local files the prompts stage reads: the `pofe.prompts` entry's
    and each local `pofe.round_prompts` set's (a hub dataset is named by its revision instead)."""
    from types import SimpleNamespace

    from pofe.data.sources import local_files_digest

    # a round's prompt set: a local file, or a dataset spec whose `path` may be local too
    sets = pcfg.round_prompts if isinstance(pcfg.round_prompts, list) else []
    paths = [str(cfg.datasets[0].path)] + [str(getattr(source, "path", source)) for source in sets]
    digests = local_files_digest([SimpleNamespace(path=p) for p in paths])
    return {p: d for p, d in zip(paths, digests) if d is not None}


def check_prompt_sources(sources: dict[str, str], state: RunState) -> None:
    """Record `sources` at the run's first start; later, refuse a prompt file that changed."""
    recorded = state.prompt_sources
    if recorded is None:
        state.prompt_sources = sources
        state.save()
        return
    changed = [p for p in sorted(set(recorded) | set(sources)) if recorded.get(p) != sources.get(p)]
    if changed:
        raise RunStateMismatch(
            f"the prompt file {changed[0]} changed since this run wrote its rounds' prompts (prompts/ in "
            f"{state.path.parent}; its sha256 then is recorded in {state.path}): later rounds would not train "
            "on it. Restore the file, or start the run again in a new output_dir."
        )


def redo_damaged_stages(folder: RunFolder, state: RunState, t: int, echo: Echo) -> None:
    """Before round t runs: mark a finished stage unfinished when what it made, and a later
    stage reads, is damaged or gone, so it runs again.

    - preprocess: the candidates' data.jsonl is not the file the stage wrote
      (`pofe_candidates.build.data_problem`); its tokenised rows are dropped with it, so the
      stage rebuilds the file from its shards (generating and judging nothing), and a damaged file
      is never trained on, published or recorded as trained on.
    - merge: the merged model's folder is gone (deleted to save space) or has no config.json.
    """
    from pofe_candidates.build import data_problem

    stage = f"round-{t}/preprocess"
    problem = data_problem(folder.candidates(t)) if state.done(stage) else None
    if problem:
        echo(f"round {t}: {problem}: preprocessing again, which rebuilds it from its shards")
        state.forget(stage)
        shutil.rmtree(folder.prepared(t), ignore_errors=True)
    stage = f"round-{t}/merge"
    merged: Path = folder.merged(t)
    if state.done(stage) and not (merged / "config.json").is_file():
        echo(f"round {t}: {merged} is missing (or has no config.json) though the state says merged: merging again")
        state.forget(stage)
