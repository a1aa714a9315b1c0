"""Every shipped recipe loads and passes axolotl's validation with the plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from axolotl.cli.config import prepare_plugins
from axolotl.utils.config import validate_config
from axolotl.utils.dict import DictDefault

RECIPES = sorted((Path(__file__).parents[1] / "recipes").glob("*.yml"))
H100 = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": 1, "compute_capability": "sm_90"}
CPU = {"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}


def test_recipes_exist_for_each_method_and_setup():
    names = {p.stem for p in RECIPES}
    for method in ("rrhf", "sppo"):
        assert {f"{method}-qlora", f"{method}-zero3", f"tiny-{method}-cpu"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates(path):
    raw = yaml.safe_load(path.read_text())
    method = raw["rl"]
    cfg = DictDefault(raw)
    prepare_plugins(cfg)
    caps = CPU if path.stem.startswith("tiny-") else H100
    cfg = validate_config(cfg, capabilities=caps, env_capabilities={"torch_version": "2.13.0"})
    assert cfg.rl is None and cfg.pofe.method == method
    assert cfg.sample_packing is False
    if path.stem.endswith("qlora"):
        assert cfg.adapter == "qlora" and cfg.load_in_4bit
    if path.stem.endswith("zero3"):
        ds = json.loads((path.parents[1] / cfg.deepspeed).read_text())
        assert ds["zero_optimization"]["stage"] == 3
        assert cfg.adapter is None  # full fine-tuning


def test_verifier_recipe_gives_sharp_preferences_on_all_k_samples():
    """SPPO on a verifier: hard preferences, every sample kept (the method's dedupe default)."""
    from pofe.args import pofe_config

    cfg = DictDefault(yaml.safe_load((RECIPES[0].parent / "tiny-sppo-verifier-cpu.yml").read_text()))
    prepare_plugins(cfg)
    pofe = pofe_config(validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"}))
    assert pofe.method == "sppo" and pofe.judge.type == "python" and pofe.judge.preferences == "hard"
    assert pofe.generate.dedupe is None and pofe.generate.for_method("sppo").dedupe is False


@pytest.mark.parametrize("name", ["rrhf-qlora", "rrhf-zero3"])
def test_rrhf_recipes_run_the_papers_pipeline_on_hh(name):
    """HH prompts read as chat turns (the `prompt_format` key survives axolotl's dataset
    schema), 4 samples plus the dataset's chosen and rejected responses, a reward model."""
    from pofe.args import pofe_config

    cfg = DictDefault(yaml.safe_load((RECIPES[0].parent / f"{name}.yml").read_text()))
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=H100, env_capabilities={"torch_version": "2.13.0"})
    pofe = pofe_config(cfg)
    assert cfg.datasets[0].type == "pofe.prompts"
    assert pofe.dataset_fields == [{"prompt_format": "hh"}]
    assert pofe.generate.num_candidates == 4 and pofe.generate.strategy == "sample"
    assert pofe.generate.include_dataset_responses == ["chosen", "rejected"]
    assert pofe.judge.type == "reward_model" and pofe.judge.model.count("/") == 1  # a hub id


def test_iterated_rounds_keep_the_prompt_format(tmp_path):
    """`axolotl pofe run` writes each round's recipe from the user's: HH prompts stay HH."""
    from pofe.run.layout import RunLayout
    from pofe.run.recipe import round_recipe

    raw = yaml.safe_load((RECIPES[0].parent / "rrhf-qlora.yml").read_text())
    recipe, _ = round_recipe(raw, RunLayout(tmp_path), 2, "/m/round-1", seed=1)
    (entry,) = recipe["datasets"]
    assert entry["prompt_format"] == "hh" and entry["type"] == "pofe.prompts"
