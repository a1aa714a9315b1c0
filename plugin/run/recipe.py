"""The user's recipe: loaded as axolotl loads it, and its fingerprint (what a run is of).

Each round runs a recipe derived from it (`pofe.run.rounds.round_recipe`).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from pofe.args import PofeConfig, pofe_config, translate_raw_config
from pofe.files import stable_hash

# Keys of the pofe block that may change between starts of one run without invalidating
# finished stages (rounds may grow when prompts are not split; eval settings only affect eval,
# stop_when only which rounds run;
# overwrite_output_dir only lets the first start into a folder that is not yet a run).
FREE_POFE_KEYS = ("rounds", "eval", "stop_when", "overwrite_output_dir")


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


def translated_recipe(raw: dict) -> tuple[dict, PofeConfig]:
    """A copy of the recipe's YAML as POFE translates it before axolotl validates it
    (`translate_raw_config`: `rl: rrhf|sppo` and the dataset field keys under `pofe:`, LoRA
    kernels off unless set), and its validated `pofe:` block: what `axolotl train` runs, read
    without loading the recipe through axolotl (which may reach the network)."""
    recipe = translate_raw_config(copy.deepcopy(raw))
    return recipe, pofe_config(recipe)
