"""`${HOME}` and `~` in a recipe's paths: refused at load, naming the key and the path meant."""

from __future__ import annotations

import pytest

from pofe.paths import MissingBaseModel, check_resumed_base_model, check_unexpanded_paths


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
    with pytest.raises(MissingBaseModel) as refused:
        PofePlugin().register({"base_model": gone, "rl": "rrhf", "resume_from_checkpoint": checkpoint})
    assert str(refused.value) == (
        f"base_model: {gone!r} does not exist, and cannot be a hub repo id. A training "
        f"resumed from {checkpoint} loads the model from base_model first (the checkpoint holds the trained "
        "weights only), and an online run's pi_0 is base_model: put the model the training started from back at "
        "that path, or set base_model to where it is now."
    )
    auto = {"base_model": "outputs/demo/model", "auto_resume_from_checkpoints": True, "output_dir": "out"}
    check_resumed_base_model(auto)  # no checkpoint yet: a first training, which axolotl's own loading refuses
    (tmp_path / "out" / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(
        MissingBaseModel,
        match=rf"'outputs/demo/model' does not exist \(resolved from {tmp_path}\), .* resumed from its output_dir's last",
    ):
        check_resumed_base_model(auto)
    check_resumed_base_model({"base_model": "Qwen/Qwen2.5-0.5B", "resume_from_checkpoint": checkpoint})
    check_resumed_base_model({"base_model": gone})  # a first training
    (tmp_path / "outputs" / "demo" / "model").mkdir(parents=True)
    check_resumed_base_model({"base_model": "outputs/demo/model", "resume_from_checkpoint": checkpoint})
