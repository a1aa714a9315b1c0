"""A recipe's own modules import from its folder and the working directory (`pofe.recipe_modules`),
after the installed packages; the folders reach the processes a command starts."""

from __future__ import annotations

import importlib
import os
import sys

from pofe.recipe_modules import RECIPE_DIRS_ENV, add_recipe_dirs


def test_the_recipe_folder_and_the_working_directory_follow_the_installed_packages(tmp_path, monkeypatch):
    """A module beside the recipe imports; one named like an installed package (`yaml.py`) does
    not replace it; the folders are recorded for children, with those a parent recorded, once."""
    recipe_dir, cwd, parent = tmp_path / "recipes", tmp_path / "cwd", tmp_path / "parent"
    for d in (recipe_dir, cwd, parent):
        d.mkdir()
    (recipe_dir / "pofe_test_rewards_beside.py").write_text("VALUE = 3\n")
    (recipe_dir / "yaml.py").write_text("raise RuntimeError('shadowed')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(cwd)
    monkeypatch.setenv(RECIPE_DIRS_ENV, os.pathsep.join([str(parent), str(cwd)]))
    dirs = add_recipe_dirs(recipe_dir / "recipe.yml")
    assert dirs == [str(recipe_dir), str(cwd), str(parent)]
    assert sys.path[-3:] == dirs and os.environ[RECIPE_DIRS_ENV] == os.pathsep.join(dirs)
    assert importlib.import_module("pofe_test_rewards_beside").VALUE == 3
    assert importlib.import_module("yaml").__file__ != str(recipe_dir / "yaml.py")
    assert add_recipe_dirs(recipe_dir / "recipe.yml") == dirs and sys.path[-3:] == dirs  # no repeats
    sys.modules.pop("pofe_test_rewards_beside", None)


def test_without_a_recipe_file_the_working_directory_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RECIPE_DIRS_ENV, raising=False)
    assert add_recipe_dirs(None) == [str(tmp_path)]
