"""What a restarted run checks before it trusts a finished stage: that its inputs did not
change and its output is still there.

- The prompt files (`check_prompt_sources`): the `prompts` stage copies the recipe's prompt
  dataset into `prompts/round-<t>.jsonl` once. A prompt file replaced afterwards would be
  ignored by every later round, so its sha256 is recorded at that stage, and a restart
  with another file stops, naming it.
- A round's merged model (`redo_lost_merge`): the next round loads `round-<t>/merged`. When
  it is gone (deleted to save space) while the state says merged, the merge stage runs
  again from the round's adapter, instead of every later start failing on a missing model.
"""

from __future__ import annotations

from pathlib import Path

from .layout import RunLayout, RunState, RunStateMismatch
from .stages import Echo


def prompt_sources(cfg, pcfg) -> dict[str, str]:
    """{path: sha256} of the local files the prompts stage reads: the `pofe.prompts` entry's
    and each local `pofe.round_prompts` set's (a hub dataset is named by its revision instead)."""
    from types import SimpleNamespace

    from ..data.sources import local_files_digest

    # a round's prompt set: a local file, or a dataset spec whose `path` may be local too
    sets = pcfg.round_prompts if isinstance(pcfg.round_prompts, list) else []
    paths = [str(cfg.datasets[0].path)] + [str(getattr(source, "path", source)) for source in sets]
    digests = local_files_digest([SimpleNamespace(path=p) for p in paths])
    return {p: d for p, d in zip(paths, digests) if d is not None}


def check_prompt_sources(sources: dict[str, str], state: RunState) -> None:
    """Record `sources` at the run's first start; later, refuse a prompt file that changed."""
    recorded = state.data.get("prompt_sources")
    if recorded is None:
        state.data["prompt_sources"] = sources
        state.save()
        return
    changed = [p for p in sorted(set(recorded) | set(sources)) if recorded.get(p) != sources.get(p)]
    if changed:
        raise RunStateMismatch(
            f"the prompt file {changed[0]} changed since this run wrote its rounds' prompts (prompts/ in "
            f"{state.path.parent}; its sha256 then is recorded in {state.path}): later rounds would not train "
            "on it. Restore the file, or start the run again in a new output_dir.")


def redo_lost_merge(layout: RunLayout, state: RunState, t: int, echo: Echo) -> None:
    """Mark round t's merge unfinished when its merged model's folder is gone or has no config."""
    stage = f"round-{t}/merge"
    merged: Path = layout.merged(t)
    if state.done(stage) and not (merged / "config.json").is_file():
        echo(f"round {t}: {merged} is missing (or has no config.json) though the state says merged: merging again")
        state.data["stages"].pop(stage)
        state.save()
