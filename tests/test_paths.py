"""`${HOME}` and `~` in a recipe's paths, and a resumed training's model folders that are gone: refused at load."""

from __future__ import annotations

import pytest
import yaml

from pofe.paths import MissingModel, check_resumed_models, check_unexpanded_paths
from tests.helpers import ROOT, run_axolotl


def test_environment_variables_and_tilde_in_paths_are_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", "/home/me")
    with pytest.raises(
        ValueError,
        match=r"base_model: '\$\{HOME\}/models/x' holds an environment variable .* "
        r"axolotl does not expand.*\(here: '/home/me/models/x'\)",
    ):
        check_unexpanded_paths({"base_model": "${HOME}/models/x"})
    with pytest.raises(ValueError, match=r"datasets\[1\]\.path: '~/d.jsonl'.*\(here: '/home/me/d.jsonl'\)"):
        check_unexpanded_paths({"datasets": [{"path": "a.jsonl"}, {"path": "~/d.jsonl"}]})
    with pytest.raises(ValueError, match=r"pofe\.judge\.model: '\$RM'"):
        check_unexpanded_paths({"pofe": {"judge": {"model": "$RM"}}})
    # hub ids, plain paths, and a folder that really has a '$' in its name pass
    odd = tmp_path / "$weird"
    odd.mkdir()
    check_unexpanded_paths({"base_model": "Qwen/Qwen2.5-0.5B", "output_dir": "./out", "lora_model_dir": str(odd)})


def test_the_plugin_checks_paths_when_a_recipe_loads():
    from pofe.plugin import PofePlugin

    with pytest.raises(ValueError, match=r"base_model: '\$\{HOME\}/x'"):
        PofePlugin().register({"base_model": "${HOME}/x", "rl": "rrhf"})


def test_a_resumed_trainings_missing_base_model_folder_is_named_at_load(tmp_path, monkeypatch):
    """Resumed, a base_model folder that is gone is refused when the recipe loads, naming it and
    the checkpoint (transformers' "Repo id must be in the form..." came after axolotl read the
    recipe); a hub id, a folder that exists, or a training not resumed pass."""
    from pofe.plugin import PofePlugin

    monkeypatch.chdir(tmp_path)
    gone = str(tmp_path / "outputs" / "model")
    checkpoint = str(tmp_path / "out" / "checkpoint-1")
    with pytest.raises(MissingModel) as refused:
        PofePlugin().register({"base_model": gone, "rl": "rrhf", "resume_from_checkpoint": checkpoint})
    assert str(refused.value) == (
        f"base_model: {gone!r} does not exist, and cannot be a hub repo id. A training "
        f"resumed from {checkpoint} loads the model from base_model first (the checkpoint holds the trained "
        "weights only), and an online run's pi_0 is base_model: put the model the training started from back at "
        "that path, or set base_model to where it is now."
    )
    auto = {"base_model": "outputs/demo/model", "auto_resume_from_checkpoints": True, "output_dir": "out"}
    check_resumed_models(auto, [])  # no checkpoint yet: a first training, which axolotl's own loading refuses
    (tmp_path / "out" / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(
        MissingModel,
        match=rf"'outputs/demo/model' does not exist \(resolved from {tmp_path}\), .* resumed from its output_dir's last",
    ):
        check_resumed_models(auto, [])
    check_resumed_models({"base_model": "Qwen/Qwen2.5-0.5B", "resume_from_checkpoint": checkpoint}, [])
    check_resumed_models({"base_model": gone}, [])  # a first training
    (tmp_path / "outputs" / "demo" / "model").mkdir(parents=True)
    check_resumed_models({"base_model": "outputs/demo/model", "resume_from_checkpoint": checkpoint}, [])


def test_a_resumed_trainings_missing_judge_model_is_named_at_load(tmp_path, monkeypatch):
    """`axolotl train` resuming the shipped online SPPO recipe with a GPM judge whose folder is gone:
    refused as the recipe loads, naming the key and the path (transformers' "Repo id must be..." came at
    the first refresh, after the policy had loaded). A judge that loads no weights (an LLM judge's model
    is a served name) is not a path; a first training is not checked here."""
    from pofe.plugin import PofePlugin

    monkeypatch.chdir(tmp_path)
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny-sppo-online-cpu.yml").read_text())
    gpm = tmp_path / "judges" / "gpm"
    recipe["pofe"]["judge"] = {"type": "gpm", "model": str(gpm)}
    recipe["resume_from_checkpoint"] = "outputs/demo/sppo-online/checkpoint-3"
    (tmp_path / "outputs" / "demo" / "model").mkdir(parents=True)  # base_model is there
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    proc = run_axolotl("train", "recipe.yml", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert (
        f"pofe.judge.model: '{gpm}' does not exist, and cannot be a hub repo id. "
        "The training resumed from outputs/demo/sppo-online/checkpoint-3 judges with it, loading it after the "
        "policy: put the judge's model back at that path, or set pofe.judge.model to where it is now."
    ) in proc.stderr
    assert "Repo id" not in proc.stderr
    PofePlugin().register({**recipe, "resume_from_checkpoint": None})  # a first training
    gpm.mkdir(parents=True)
    PofePlugin().register(recipe)
    llm = {"type": "llm", "model": "served/judge/name", "base_url": "http://127.0.0.1:1/v1"}
    PofePlugin().register({**recipe, "pofe": {**recipe["pofe"], "judge": llm}})
