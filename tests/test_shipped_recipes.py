"""`axolotl pofe recipes`: the recipes shipped inside the package, listed and copied.

The repository's `recipes/` is the package's folder (a link), so a clone and a wheel hold the
same files; `tests/test_wheel.py` copies and trains one from the wheel.
"""

from __future__ import annotations

import re
import shlex

from click.testing import CliRunner

from pofe.cli import pofe
from pofe.shipped_recipes import FOLDER, shipped
from tests.helpers import ROOT, run_axolotl


def recipes(*args: str):
    return CliRunner().invoke(pofe, ["recipes", *args])


def test_the_repository_recipes_folder_is_the_package_data():
    assert (ROOT / "recipes").is_symlink() and (ROOT / "recipes").resolve() == ROOT / "plugin" / "pofe" / "recipes"
    assert sorted(r.name for r in shipped()) == sorted(p.stem for p in (ROOT / "recipes").glob("*.yml"))


def test_the_list_names_each_recipe_with_its_first_clause():
    out = recipes()
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert len(lines) == len(shipped()) + 2  # a line each, a blank line, how to copy one
    width = max(len(r.name) for r in shipped())  # names padded to the longest
    assert f"{'sppo-qlora':<{width}}  SPPO with QLoRA on one 24-80 GB GPU, as the paper runs it" in lines
    assert lines[-1] == "`axolotl pofe recipes NAME` copies one into recipes/"
    zero3 = [line for line in lines if line.startswith("sppo-zero3 ")]
    assert zero3 and zero3[0].endswith("(+ recipes/deepspeed/zero3_bf16.json)")


def test_the_console_names_the_three_methods_and_each_first_clause_whole():
    """`axolotl pofe --help` and `axolotl pofe recipes` as a user runs them (issue 49): the help
    names every method, and a clause's citation "(Munos et al. 2023)" is not cut at its "al. "."""
    assert "POFE (RRHF, SPPO, Nash-MD) tools." in run_axolotl("pofe", "--help").stdout
    lines = run_axolotl("pofe", "recipes").stdout.splitlines()
    nash_md = "Nash-MD (Munos et al. 2023) with QLoRA on one 24-80 GB GPU, trained online in one command"
    assert any(line.startswith("nash-md-qlora-online ") and line.endswith(nash_md) for line in lines), lines
    for recipe in shipped():
        assert recipe.summary.count("(") == recipe.summary.count(")"), recipe


def test_a_copy_brings_the_deepspeed_config_it_names(tmp_path, monkeypatch):
    """Into recipes/ (the default) byte for byte; elsewhere the `deepspeed:` line names the copied
    config, the only line that differs."""
    monkeypatch.chdir(tmp_path)
    shipped_recipe, shipped_config = FOLDER / "sppo-zero3.yml", FOLDER / "deepspeed" / "zero3_bf16.json"
    out = recipes("sppo-zero3", "tiny-rrhf-cpu")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines() == [
        "wrote recipes/sppo-zero3.yml",
        "wrote recipes/deepspeed/zero3_bf16.json",
        "wrote recipes/tiny-rrhf-cpu.yml",
    ]
    assert (tmp_path / "recipes/sppo-zero3.yml").read_bytes() == shipped_recipe.read_bytes()
    assert (tmp_path / "recipes/deepspeed/zero3_bf16.json").read_bytes() == shipped_config.read_bytes()
    assert recipes("sppo-zero3").output.splitlines() == [
        "wrote recipes/sppo-zero3.yml (already there, unchanged)",
        "wrote recipes/deepspeed/zero3_bf16.json (already there, unchanged)",
    ]

    out = recipes("sppo-zero3.yml", "--to", "runs/a")
    assert out.exit_code == 0, out.output
    copied = (tmp_path / "runs/a/sppo-zero3.yml").read_text().splitlines()
    original = shipped_recipe.read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, copied) if a != b]
    assert len(copied) == len(original)
    assert changed == [("deepspeed: recipes/deepspeed/zero3_bf16.json", "deepspeed: runs/a/deepspeed/zero3_bf16.json")]
    assert (tmp_path / "runs/a/deepspeed/zero3_bf16.json").read_bytes() == shipped_config.read_bytes()


def test_a_changed_copy_is_kept_unless_forced(tmp_path, monkeypatch):
    """A recipe edited since its copy is not overwritten, and nothing else is written either."""
    monkeypatch.chdir(tmp_path)
    edited = tmp_path / "recipes" / "sppo-zero3.yml"
    edited.parent.mkdir()
    edited.write_text("base_model: mine\n")
    out = recipes("sppo-zero3")
    assert out.exit_code == 1
    assert out.output == (
        "Error: recipes/sppo-zero3.yml exists and differs from the shipped sppo-zero3.yml: --force replaces it\n"
    )
    assert edited.read_text() == "base_model: mine\n" and not (tmp_path / "recipes" / "deepspeed").exists()
    assert recipes("sppo-zero3", "--force").exit_code == 0
    assert edited.read_bytes() == (FOLDER / "sppo-zero3.yml").read_bytes()


def test_an_unknown_name_lists_the_shipped_ones():
    out = recipes("sppo-qlroa")
    assert out.exit_code == 1
    assert out.output.startswith(
        "Error: no shipped recipe 'sppo-qlroa'; POFE ships nash-md-qlora-online, rrhf-qlora-online, "
    )


def test_the_readme_install_line_is_what_the_wheel_leg_installs():
    """The README's install line is `pip install .` from a clone, the form `make test-newest`
    installs POFE with (a wheel, not editable), its dependencies with the `dev` extra."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    first = next(line for line in section.splitlines() if line.startswith("pip install"))
    assert shlex.split(first.split("#")[0]) == ["pip", "install", "."]
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"\$\(PY_NEWEST\) -m pip install -q (.*)", makefile)
    assert [shlex.split(line)[-1] for line in installs if not line.startswith("-U") and "--target" not in line] == [
        ".[dev]",
        ".",
    ], installs
