"""Round t's derived recipe, the recipe's fingerprint, and loading the user's recipe.

Each round runs the user's recipe pointed at round t's policy, prompts and folders; it is
written to `round-<t>/recipe.yml`, so what ran can be read back.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import NamedTuple

import yaml

from pofe.files import stable_hash

from .layout import RunLayout
from .publish import hub_model_repo, tracker_keys

# Keys of the pofe block that may change between starts of one run without invalidating
# finished stages (rounds may grow when prompts are not split; eval settings only affect eval,
# stop_when only which rounds run;
# overwrite_output_dir only lets the first start into a folder that is not yet a run).
FREE_POFE_KEYS = ("rounds", "eval", "stop_when", "overwrite_output_dir")


class RoundRecipe(NamedTuple):
    """A round's recipe, and whether it saves only so that trainer_state.json exists
    (then the runner removes that checkpoint after copying the state out)."""

    recipe: dict
    forced_save: bool


def round_recipe(
    raw: dict, layout: RunLayout, t: int, policy: str, seed: int, resume_from: Path | None = None
) -> RoundRecipe:
    """Round t's recipe: the user's, pointed at round t's policy, prompts and folders.

    `save_strategy: no` becomes one save at the end (`steps` with a huge interval,
    `save_only_model`), so trainer_state.json (the loss curve) exists. `resume_from`: the
    checkpoint a killed train stage left, which the restarted one resumes from
    (`resume_from_checkpoint`). Tracker runs and hub repos are named per round
    (`pofe.run.publish`). `raw` is not changed.
    """
    recipe = copy.deepcopy(raw)
    recipe["base_model"] = policy
    for key in ("base_model_config", "tokenizer_config"):
        if t > 1 and key in recipe:
            recipe[key] = policy  # round t>1 loads everything from the previous iterate
    if t > 1:
        recipe.pop("lora_model_dir", None)  # merged into the policy already
    recipe["output_dir"] = str(layout.train(t))
    recipe["dataset_prepared_path"] = str(layout.prepared(t))
    (entry,) = recipe["datasets"]
    keep = {k: v for k, v in entry.items() if k in ("type", "prompt_format") or k.startswith("field_")}
    recipe["datasets"] = [{"path": str(layout.round_prompts(t)), "ds_type": "json", **keep}]
    pofe = recipe.setdefault("pofe", {})
    for key in ("rounds", "round_prompts", "eval", "stop_when", "hub_dataset_id", "overwrite_output_dir"):
        pofe.pop(key, None)
    recipe.update(tracker_keys(raw, t))
    model_repo = hub_model_repo(raw, t)
    if model_repo and not recipe.get("adapter"):
        recipe["hub_model_id"] = model_repo  # axolotl's trainer pushes the round's model
    else:
        recipe.pop("hub_model_id", None)  # an adapter: the runner pushes the merged iterate
    pofe["generate"] = {**pofe["generate"], "model": policy, "seed": seed}
    pofe["candidates"] = {**(pofe.get("candidates") or {}), "out_dir": str(layout.candidates(t))}
    forced_save = str(recipe.get("save_strategy", "")).lower() in ("no", "false")
    if forced_save:
        recipe["save_strategy"] = "steps"
        recipe["save_steps"] = 1_000_000_000
        recipe["save_only_model"] = True
        recipe.pop("saves_per_epoch", None)
    if resume_from is not None:
        recipe["resume_from_checkpoint"] = str(resume_from)
    return RoundRecipe(recipe, forced_save)


def recipe_fingerprint(raw: dict) -> str:
    """Hash of the recipe without the keys that may change between starts."""
    raw = copy.deepcopy(raw)
    pofe = raw.get("pofe") or {}
    for key in FREE_POFE_KEYS:
        pofe.pop(key, None)
    return stable_hash(raw)


def load_recipe(recipe_path: str | Path):
    """(raw YAML dict, axolotl's validated cfg) of the user's recipe.

    Axolotl's `load_cfg` runs `PofePlugin.register`, which checks the files the `pofe:`
    block names (`PofeConfig.check_files`) before the config is validated.
    """
    from axolotl.cli.config import load_cfg

    raw = yaml.safe_load(Path(recipe_path).read_text())
    cfg = load_cfg(str(recipe_path))
    return raw, cfg
