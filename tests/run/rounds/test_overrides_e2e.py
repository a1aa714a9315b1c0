"""`axolotl pofe run` takes axolotl's command-line overrides, as `axolotl train` does (issue 34:
`--num-epochs 3` was "No such option"), and every stage runs with them."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import DEFAULT_HELD_OUT, NUM_PROMPTS, run_axolotl, run_state, write_rounds_recipe

pytestmark = pytest.mark.e2e


def test_pofe_run_applies_axolotls_overrides_to_every_stage_and_records_them(tmp_path, tiny_model):
    """The recipe says 2 epochs at 3e-3; `--num-epochs 1 --learning-rate 0.002` on the command
    line: round 1's recipe (which its preprocess and train stages run) holds 1 and 0.002, the
    trainer ran one epoch (12 prompts after the default held-out slice of 2, micro-batch 4: 3
    steps), pofe-run.json records the options as given and pofe-recipe.yml the recipe as run.
    Started again with other options, it is another recipe: refused."""
    recipe = write_rounds_recipe(tmp_path, tiny_model, "rrhf", eval_keys=False)
    raw = yaml.safe_load(recipe.read_text())
    raw["pofe"]["rounds"] = 1
    recipe.write_text(yaml.safe_dump(raw))
    args = ("pofe", "run", str(recipe), "--launcher", "python", "--quiet", "--no-eval")
    run_axolotl(*args, "--num-epochs", "1", "--learning-rate", "0.002")

    run = tmp_path / "run"
    assert run_state(run)["overrides"] == {"num_epochs": "1", "learning_rate": "0.002"}
    derived = yaml.safe_load((run / "round-1" / "recipe.yml").read_text())
    assert (derived["num_epochs"], derived["learning_rate"]) == (1, 0.002)
    as_run = yaml.safe_load((run / "pofe-recipe.yml").read_text())
    assert (as_run["num_epochs"], as_run["learning_rate"]) == (1, 0.002)
    state = json.loads((run / "round-1" / "trainer_state.json").read_text())
    assert state["epoch"] == 1.0 and state["global_step"] == -(-(NUM_PROMPTS - DEFAULT_HELD_OUT) // 4)
    again = run_axolotl(*args, "--num-epochs", "2", check=False)
    assert again.returncode != 0 and "belongs to a run of a different recipe" in again.stdout + again.stderr
