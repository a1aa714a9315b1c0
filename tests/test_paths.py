"""`${HOME}` and `~` in a recipe's paths: refused at load, naming the key and the path meant."""

from __future__ import annotations

import pytest

from pofe.paths import check_unexpanded_paths


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
