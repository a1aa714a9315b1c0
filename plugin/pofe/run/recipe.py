"""The user's recipe: loaded as axolotl loads it, and its fingerprint (what a run is of).

Each round runs a recipe derived from it (`pofe.run.rounds.round_recipe`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from enum import Enum
from pathlib import Path

import yaml

from pofe.args import PofeConfig, pofe_config
from pofe.args.translate import translate_raw_config
from pofe.compat.axolotl_internals import load_axolotl_config, loads_installed_plugins
from pofe.errors import PofeError
from pofe.files import stable_hash
from pofe.methods import METHODS

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


def load_recipe(recipe_path: str | Path, overrides: dict | None = None):
    """(raw YAML dict, axolotl's validated cfg) of the user's recipe, with axolotl's command-line
    overrides (`--num-epochs 3`: {"num_epochs": "3"}, `--trl.beta`: {"trl__beta": ...}) applied
    to both, as `axolotl train` applies them.

    Axolotl's `load_cfg` runs `PofePlugin.register`, which checks the files the `pofe:`
    block names (`PofeConfig.check_files`) before the config is validated.
    """
    raw = yaml.safe_load(Path(recipe_path).read_text())
    check_plugin_listed(raw, recipe_path)
    cfg = load_axolotl_config(str(recipe_path), **(overrides or {}))
    return with_overrides(raw, overrides or {}, cfg), cfg


def check_plugin_listed(raw: dict, recipe_path: str | Path) -> None:
    """A recipe setting `rl:` to a POFE method must list POFE's plugin where axolotl loads only
    the plugins listed (0.19): axolotl validates `rl` before any plugin runs, and its error names
    its own methods, not the fix. `axolotl train` cannot be reached that early; POFE's commands
    say it instead."""
    rl = raw.get("rl")
    if (
        not isinstance(rl, str)
        or rl not in METHODS
        or "pofe.PofePlugin" in (raw.get("plugins") or [])
        or loads_installed_plugins()
    ):
        return
    raise PofeError(
        f"{recipe_path} sets `rl: {rl}`, a POFE method, but does not list POFE's plugin: add the line "
        "`plugins: [pofe.PofePlugin]`. This axolotl loads only the plugins a recipe lists (axolotl 0.21 "
        f"loads installed ones too); without it `axolotl train` refuses `rl: {rl}` with 'Input should be "
        "'dpo', ...' [type=enum]"
    )


def with_overrides(raw: dict, overrides: dict, cfg=None) -> dict:
    """A copy of `raw` with the command line's overrides: a key at the top level, or
    `parent__child` inside `parent` (axolotl's form for nested keys). Each value as axolotl's
    validated `cfg` holds it when given (its CLI passes most values as text, which
    `load_cfg` casts), else as given."""
    raw = copy.deepcopy(raw)
    for key, value in overrides.items():
        parent, _, child = key.partition("__")
        held = (cfg or {}).get(parent)
        held = (held or {}).get(child) if child and isinstance(held, dict) else (None if child else held)
        value = value if held is None else _plain(held)
        if child:
            if not isinstance(raw.get(parent), dict):
                raw[parent] = {}
            raw[parent][child] = value
        else:
            raw[key] = value
    return raw


def _plain(value):
    """A validated value as YAML writes it: an enum as its value, mappings as dicts."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def translated_recipe(raw: dict) -> tuple[dict, PofeConfig]:
    """A copy of the recipe's YAML as POFE translates it before axolotl validates it
    (`translate_raw_config`: `rl: rrhf|sppo` and the dataset field keys under `pofe:`, LoRA
    kernels off unless set), and its validated `pofe:` block: what `axolotl train` runs, read
    without loading the recipe through axolotl (which may reach the network)."""
    recipe = translate_raw_config(copy.deepcopy(raw))
    return recipe, pofe_config(recipe)
