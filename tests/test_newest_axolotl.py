"""What differs between the axolotl releases POFE is tested on: 0.19 (Python 3.11, `make
test-main`) and 0.21 (Python 3.12, `make test-newest`, which runs the tests marked `newest`).

- axolotl 0.21 loads installed `axolotl.plugins` entry points: `rl: rrhf` needs no
  `plugins:` line there; 0.19 reads only that line and refuses `rl: rrhf` without it.
- Neither logs a token perplexity (`ppl`, `eval_ppl`: exp of the loss, which for a ranking
  loss is no perplexity) for POFE's trainers.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points, version

import pytest
import yaml
from packaging.version import Version

from pofe.demo.task import reward
from tests.helpers import log_history, recipe, run_axolotl, write_rounds_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.newest]

AXOLOTL = Version(version("axolotl"))
# the release whose plugin manager first reads the `axolotl.plugins` entry-point group
ENTRY_POINT_PLUGINS = AXOLOTL >= Version("0.21")


def test_plugin_entry_point_names_the_recipe_plugin():
    """The entry point resolves to the class recipes list, under the same dotted name, so a
    recipe that lists `pofe.PofePlugin` as well does not load a second instance."""
    from pofe import PofePlugin

    (point,) = [p for p in entry_points(group="axolotl.plugins") if p.name == "pofe"]
    assert point.load() is PofePlugin
    assert point.value.replace(":", ".") == "pofe.PofePlugin"


def test_rl_without_plugins_line(tmp_path, tiny_model, rrhf_jsonl):
    cfg = recipe(tmp_path, tiny_model, "rrhf", rrhf_jsonl, "pofe.rrhf")
    raw = yaml.safe_load(cfg.read_text())
    del raw["plugins"]
    cfg.write_text(yaml.safe_dump(raw))
    proc = run_axolotl("train", str(cfg), check=False)
    if ENTRY_POINT_PLUGINS:
        assert proc.returncode == 0, proc.stderr[-4000:]
        steps = [h for h in log_history(tmp_path / "out") if "loss" in h]
        assert len(steps) == 8  # 32 rows / micro-batch 4
        assert all("rrhf/rank" in h for h in steps)
    else:
        # axolotl 0.19 validates `rl` against its own enum before any plugin is loaded
        assert proc.returncode != 0
        assert "[type=enum, input_value='rrhf', input_type=str]" in proc.stdout + proc.stderr


def test_pofe_commands_name_the_missing_plugins_line(tmp_path, tiny_model):
    """Issue 49: `rl: rrhf` without `plugins:` on axolotl 0.19 is a 68-line pydantic error from
    `axolotl train` (axolotl validates `rl` before any plugin runs: out of POFE's reach). POFE's
    commands that read the recipe say the fix instead (`axolotl pofe plan` planned the run and
    exited 0); on 0.21, which loads the installed plugin, the recipe plans."""
    path = write_rounds_recipe(tmp_path, tiny_model, "rrhf")
    raw = yaml.safe_load(path.read_text())
    del raw["plugins"]
    path.write_text(yaml.safe_dump(raw))
    for command in ("plan", "run") if not ENTRY_POINT_PLUGINS else ("plan",):
        proc = run_axolotl("pofe", command, str(path), check=False)
        if ENTRY_POINT_PLUGINS:
            assert proc.returncode == 0, proc.stderr[-4000:]
            continue
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines()[-1] == (
            f"Error: {path} sets `rl: rrhf`, a POFE method, but does not list POFE's plugin: add the line "
            "`plugins: [pofe.PofePlugin]`. This axolotl loads only the plugins a recipe lists (axolotl 0.21 "
            "loads installed ones too); without it `axolotl train` refuses `rl: rrhf` with 'Input should be "
            "'dpo', ...' [type=enum]"
        )
        assert "Traceback" not in proc.stdout + proc.stderr


def test_no_token_perplexity_in_log(tmp_path, tiny_model, rrhf_jsonl):
    # an eval split too: axolotl would add eval_ppl beside eval_loss
    cfg = recipe(tmp_path, tiny_model, "rrhf", rrhf_jsonl, "pofe.rrhf", val_set_size=0.25, eval_steps=3)
    proc = run_axolotl("train", str(cfg))
    history = log_history(tmp_path / "out")
    train = [h for h in history if "loss" in h]
    evals = [h for h in history if "eval_loss" in h]
    assert len(train) == 6  # 24 training rows / micro-batch 4
    assert [h["step"] for h in evals][-2:] == [3, 6]  # (axolotl also evaluates before step 1)
    assert "rrhf/rank" in train[0] and "eval_rrhf/rank" in evals[0]
    assert not [h for h in history if {"ppl", "eval_ppl"} & set(h)], history
    # listed and (on 0.21) an installed entry point: loaded once all the same
    assert (proc.stdout + proc.stderr).count("Plugin loaded successfully: pofe.PofePlugin") == 1


@pytest.mark.trl
def test_one_round_pofe_run(tmp_path, tiny_model):
    """`axolotl pofe run` for one round: prompts, candidates, training, eval, report."""
    path = write_rounds_recipe(tmp_path, tiny_model, "rrhf")
    raw = yaml.safe_load(path.read_text())
    raw["pofe"]["rounds"] = 1
    path.write_text(yaml.safe_dump(raw))
    run_axolotl("pofe", "run", str(path), "--launcher", "python", "--quiet")

    run = tmp_path / "run"
    state = json.loads((run / "pofe-run.json").read_text())
    assert all(s["status"] == "done" for s in state["stages"].values()), state["stages"]
    assert state["final_policy"] == str(run / "round-1" / "train")
    history = json.loads((run / "round-1" / "trainer_state.json").read_text())["log_history"]
    assert [h for h in history if "loss" in h] and not [h for h in history if "ppl" in h]

    rep = json.loads((run / "report.json").read_text())
    assert rep["rounds_finished"] == 1
    names = [m["name"] for m in rep["eval"]["models"]]
    assert names == ["pi_0", "pi_1"]
    samples = [json.loads(line) for line in (run / "eval" / "samples.jsonl").read_text().splitlines()]
    for m, name in enumerate(names):
        # the judge, called again on the stored responses
        rewards = [reward(s["prompt"], s["response"]) for s in samples if s["model"] == name]
        assert len(rewards) == 4 * 2  # held-out prompts x samples
        assert rep["eval"]["mean_reward"][m] == pytest.approx(sum(rewards) / len(rewards))
