"""Round t's derived recipe: the user's recipe pointed at round t's policy, prompts and folders.

Each round runs the user's recipe changed only in where things are; it is written to
`round-<t>/recipe.yml`, so what ran can be read back.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import NamedTuple

from pofe.run.folder import RunFolder
from pofe.run.rounds.publish import hub_model_repo, tracker_keys


class RoundRecipe(NamedTuple):
    """A round's recipe, and whether it saves only so that trainer_state.json exists
    (then the runner removes that checkpoint after copying the state out)."""

    recipe: dict
    forced_save: bool


def round_recipe(
    raw: dict,
    folder: RunFolder,
    t: int,
    policy: str,
    seed: int,
    resume_from: Path | None = None,
    pi_0: str | None = None,
) -> RoundRecipe:
    """Round t's recipe: the user's, pointed at round t's policy, prompts and folders.

    `save_strategy: no` becomes one save at the end (`steps` with a huge interval,
    `save_only_model`), so trainer_state.json (the loss curve) exists. `resume_from`: the
    checkpoint a killed train stage left, which the restarted one resumes from
    (`resume_from_checkpoint`). Tracker runs and hub repos are named per round
    (`pofe.run.rounds.publish`). With `pofe.anchor_mix`, every round mixes its own pi_t with the
    same pi_0, the run's first policy (`pi_0`), named as `pofe.pi_0` unless the recipe
    names one itself. `raw` is not changed.
    """
    recipe = copy.deepcopy(raw)
    recipe["base_model"] = policy
    for key in ("base_model_config", "tokenizer_config"):
        if t > 1 and key in recipe:
            recipe[key] = policy  # round t>1 loads everything from the previous iterate
    if t > 1:
        recipe.pop("lora_model_dir", None)  # merged into the policy already
    recipe["output_dir"] = str(folder.train(t))
    recipe["dataset_prepared_path"] = str(folder.prepared(t))
    (entry,) = recipe["datasets"]
    keep = {k: v for k, v in entry.items() if k in ("type", "prompt_format") or k.startswith("field_")}
    recipe["datasets"] = [{"path": str(folder.round_prompts(t)), "ds_type": "json", **keep}]
    pofe = recipe.setdefault("pofe", {})
    for key in ("rounds", "round_prompts", "eval", "stop_when", "hub_dataset_id", "overwrite_output_dir"):
        pofe.pop(key, None)
    recipe.update(tracker_keys(raw, t))
    model_repo = hub_model_repo(raw, t)
    if model_repo and not recipe.get("adapter"):
        recipe["hub_model_id"] = model_repo  # axolotl's trainer pushes the round's model
    else:
        recipe.pop("hub_model_id", None)  # an adapter: the runner pushes the merged iterate
    if pofe.get("anchor_mix") and not pofe.get("pi_0") and pi_0:
        pofe["pi_0"] = pi_0
    pofe["generate"] = {**pofe["generate"], "model": policy, "seed": seed}
    pofe["candidates"] = {**(pofe.get("candidates") or {}), "out_dir": str(folder.candidates(t))}
    forced_save = str(recipe.get("save_strategy", "")).lower() in ("no", "false")
    if forced_save:
        recipe["save_strategy"] = "steps"
        recipe["save_steps"] = 1_000_000_000
        recipe["save_only_model"] = True
        recipe.pop("saves_per_epoch", None)
    if resume_from is not None:
        recipe["resume_from_checkpoint"] = str(resume_from)
    return RoundRecipe(recipe, forced_save)
