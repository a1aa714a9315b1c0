"""Round t's derived recipe (`pofe.run.rounds.round_recipe`): everything pointed at the round."""

from __future__ import annotations

from pofe.run.folder import RunFolder
from pofe.run.rounds.round_recipe import round_recipe
from tests.helpers import ITERATED_RAW


def test_round_recipe_points_everything_at_the_round():
    folder = RunFolder(__import__("pathlib").Path("/runs/x"))
    r1, _ = round_recipe(ITERATED_RAW, folder, 1, "/m/base", seed=7)
    r2, forced_save = round_recipe(ITERATED_RAW, folder, 2, "/runs/x/round-1/merged", seed=8)
    assert r1["lora_model_dir"] == "/m/adapter" and "lora_model_dir" not in r2  # merged already
    assert r2["base_model"] == "/runs/x/round-1/merged"
    assert r2["output_dir"] == "/runs/x/round-2/train"
    assert r2["dataset_prepared_path"] == "/runs/x/round-2/prepared"
    assert r2["datasets"] == [
        {"path": "/runs/x/prompts/round-2.jsonl", "ds_type": "json", "type": "pofe.prompts", "field_prompt": "q"}
    ]
    assert r2["pofe"]["generate"] == {"backend": "transformers", "seed": 8, "model": "/runs/x/round-1/merged"}
    assert r2["pofe"]["candidates"] == {"out_dir": "/runs/x/round-2/candidates"}
    assert "rounds" not in r2["pofe"] and "eval" not in r2["pofe"]
    # save_strategy: no -> one save at the end, so trainer_state.json (the loss curve) exists
    assert r2["save_strategy"] == "steps" and r2["save_only_model"] and forced_save
    assert ITERATED_RAW["base_model"] == "/m/base" and ITERATED_RAW["save_strategy"] == "no"  # the input is untouched


def test_every_round_mixes_toward_the_same_pi_0():
    """With anchor_mix each round's recipe names the run's first policy as pi_0: round 1
    (pi_0 is its own policy: base + the recipe's adapter) and round 2 (base_model the merged
    pi_1) alike. Without anchor_mix nothing is added; a recipe's own pi_0 is kept."""
    folder = RunFolder(__import__("pathlib").Path("/runs/x"))
    mixed = {**ITERATED_RAW, "pofe": {**ITERATED_RAW["pofe"], "anchor_mix": 0.2}}
    r1, _ = round_recipe(mixed, folder, 1, "/m/base", seed=7, pi_0="/m/adapter")
    r2, _ = round_recipe(mixed, folder, 2, "/runs/x/round-1/merged", seed=8, pi_0="/m/adapter")
    assert r1["pofe"]["pi_0"] == r2["pofe"]["pi_0"] == "/m/adapter"
    assert r2["base_model"] == "/runs/x/round-1/merged" and r2["pofe"]["anchor_mix"] == 0.2
    plain, _ = round_recipe(ITERATED_RAW, folder, 2, "/runs/x/round-1/merged", seed=8, pi_0="/m/adapter")
    assert "pi_0" not in plain["pofe"]
    own = {**ITERATED_RAW, "pofe": {**mixed["pofe"], "pi_0": "/m/sft"}}
    assert round_recipe(own, folder, 2, "/r/merged", seed=8, pi_0="/m/adapter")[0]["pofe"]["pi_0"] == "/m/sft"
