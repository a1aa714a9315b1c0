"""A recipe's own modules import from its folder and the working directory (`pofe.recipe_modules`),
without those folders on the import path; the folders reach the processes a command starts."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys

import pytest

from pofe.recipe_modules import RECIPE_DIRS_ENV, RecipeModuleError, add_recipe_dirs
from pofe_candidates.identity import module_digest
from pofe_candidates.judges.user_functions import load_dotted, load_function


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch):
    """A recipe's folder holding a judge module, a user's `mlflow.py` and `apex.py` (optional
    packages DeepSpeed and transformers probe for, not installed here) and a `yaml.py`; the
    recorded folders and the import path restored after the test."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "pofe_test_judge_beside.py").write_text("def reward(prompt, response):\n    return 3.0\n")
    for name in ("mlflow", "apex", "yaml"):
        (folder / f"{name}.py").write_text("raise RuntimeError('the user file was imported')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv(RECIPE_DIRS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    yield folder
    for name in ("pofe_test_judge_beside", "pofe_test_pkg_beside", "pofe_test_pkg_beside.rewards"):
        sys.modules.pop(name, None)


def test_the_folders_are_recorded_for_children_once(tmp_path, monkeypatch):
    """The recipe's folder, the working directory, then those a parent recorded, each once."""
    recipe_dir, cwd, parent = tmp_path / "recipes", tmp_path / "cwd", tmp_path / "parent"
    for d in (recipe_dir, cwd, parent):
        d.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv(RECIPE_DIRS_ENV, os.pathsep.join([str(parent), str(cwd)]))
    dirs = add_recipe_dirs(recipe_dir / "recipe.yml")
    assert dirs == [str(recipe_dir), str(cwd), str(parent)] and os.environ[RECIPE_DIRS_ENV] == os.pathsep.join(dirs)
    assert add_recipe_dirs(recipe_dir / "recipe.yml") == dirs  # no repeats


def test_a_judge_beside_the_recipe_loads_without_its_folder_on_the_import_path(recipe_dir):
    """Issue 50: the recipe's folder stayed on `sys.path` for the whole process, so a user's
    `apex.py` or `mlflow.py` beside the recipe answered DeepSpeed's and transformers' probes for
    those packages. Now the judge module loads from its folder, stays importable by its name,
    and the import path is as it was: the probes find nothing; an installed package (`yaml`) is
    never replaced."""
    before = list(sys.path)
    add_recipe_dirs(recipe_dir / "recipe.yml")
    reward = load_function("pofe_test_judge_beside:reward")
    assert reward("p", "r") == 3.0 and sys.modules["pofe_test_judge_beside"].reward is reward
    assert sys.path == before
    assert importlib.util.find_spec("mlflow") is None and importlib.util.find_spec("apex") is None
    assert importlib.import_module("yaml").__file__ != str(recipe_dir / "yaml.py")
    # its source is what keys the judge's shards: found without the folder on the path
    digest = hashlib.sha256((recipe_dir / "pofe_test_judge_beside.py").read_bytes()).hexdigest()
    assert module_digest("pofe_test_judge_beside") == digest and sys.path == before


def test_a_package_beside_the_recipe_and_a_child_process_find_their_modules(recipe_dir):
    """A package (`reward_funcs: [pkg.rewards.f]`) loads the same way; a process started with
    the recorded folders (a run's stage) finds the module without anything on its path."""
    package = recipe_dir / "pofe_test_pkg_beside"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "rewards.py").write_text("def f(prompts, completions, **kwargs):\n    return [1.0] * len(prompts)\n")
    before = list(sys.path)
    add_recipe_dirs(recipe_dir / "recipe.yml")
    assert load_dotted("pofe_test_pkg_beside.rewards.f", "judge.reward_funcs")(["p"], ["c"]) == [1.0]
    assert sys.path == before
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.util; from pofe_candidates.judges.user_functions import load_function; "
            "print(load_function('pofe_test_judge_beside:reward')('p', 'r'), importlib.util.find_spec('mlflow'))",
        ],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(recipe_dir),
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in before if p)},
    )
    assert (child.returncode, child.stdout) == (0, "3.0 None\n"), child.stderr


def test_a_judge_module_named_like_a_standard_module_is_an_error(recipe_dir):
    """A `json.py` beside the recipe (`judge.function: json:reward`) was silently the standard
    library's json ("module 'json' has no attribute 'reward'"); now an error names both files
    and what to do."""
    (recipe_dir / "json.py").write_text("def reward(prompt, response):\n    return 1.0\n")
    add_recipe_dirs(recipe_dir / "recipe.yml")
    with pytest.raises(RecipeModuleError) as caught:
        load_function("json:reward")
    assert str(caught.value) == (
        f"judge.function 'json:reward': {recipe_dir / 'json.py'} is named like the module 'json' that Python "
        f"already imports ({importlib.util.find_spec('json').origin}), which the recipe would get instead of your "
        "file. Rename your file (e.g. to my_json) and the module in the recipe with it"
    )


def test_without_a_recipe_file_the_working_directory_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RECIPE_DIRS_ENV, raising=False)
    assert add_recipe_dirs(None) == [str(tmp_path)]
