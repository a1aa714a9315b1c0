"""Refuse `$VAR`, `${VAR}` and `~` in a recipe's paths, which axolotl reads as written.

Axolotl expands neither environment variables nor `~`: `base_model: ${HOME}/models/x` names a
folder literally called `${HOME}`, and fails later as an unknown hub repo id, an unrelated
message. POFE does not expand them either, so a recipe means the same with and without the
plugin; it says so at load, with the path the shell would have meant. A path that exists as
written (a folder really named `$x`) passes.

A resumed training's `base_model` folder gone (moved, deleted) fails the same way, as an unknown
hub repo id, and so does a judge's model folder (`pofe.judge.model` of a GPM, PairRM or reward
model), after the policy has loaded: `check_resumed_models` names each at load instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pofe.errors import PofeError

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


class MissingModel(PofeError, ValueError):
    """A model the recipe names is no folder and cannot be a hub id."""


def is_hub_id(model: str) -> bool:
    """Whether `model` can name a hub repository (`name` or `namespace/name`, as huggingface_hub
    checks one); else it can only be a local path (`/abs/dir`, `./dir`, `a/b/c`), as transformers
    reads it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def check_model_path(key: str, model: str, loads: str) -> None:
    """Refuse `model` (the recipe's `key`) when it is no folder or file on disk and cannot be a hub id
    (`name`, `namespace/name`): transformers would say "Repo id must be..." when it loads it. `loads`:
    what loads it, and what to do."""
    if Path(model).exists() or is_hub_id(model):
        return
    where = "" if Path(model).is_absolute() else f" (resolved from {os.getcwd()})"
    raise MissingModel(f"{key}: {model!r} does not exist{where}, and cannot be a hub repo id. {loads}")


def check_resumed_models(cfg: dict[str, Any], judges: list[tuple[str, str]]) -> None:
    """A training resumed (`resume_from_checkpoint`; `auto_resume_from_checkpoints` with a
    checkpoint in output_dir) loads the model from `base_model` before the checkpoint's weights, and
    online pi_0 is base_model; its judges (`judges`: (key, model path) of each that loads weights)
    load theirs at the first refresh or judge stage, after the policy. Each that is no folder on disk
    and cannot be a hub id is refused, naming it, before anything loads."""
    auto = cfg.get("auto_resume_from_checkpoints") and any(Path(cfg.get("output_dir") or ".").glob("checkpoint-*"))
    if not (cfg.get("resume_from_checkpoint") or auto):
        return
    checkpoint = cfg.get("resume_from_checkpoint") or "its output_dir's last checkpoint"
    if isinstance(base_model := cfg.get("base_model"), str):
        check_model_path(
            "base_model",
            base_model,
            f"A training resumed from {checkpoint} loads the model from base_model first (the checkpoint holds "
            "the trained weights only), and an online run's pi_0 is base_model: put the model the training started "
            "from back at that path, or set base_model to where it is now.",
        )
    for key, model in judges:
        check_model_path(
            key,
            model,
            f"The training resumed from {checkpoint} judges with it, loading it after the policy: put the judge's "
            f"model back at that path, or set {key} to where it is now.",
        )
