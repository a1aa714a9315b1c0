"""`axolotl pofe recipes`: the recipes shipped inside the package, listed and copied.

The repository's `recipes/` is the package's folder (a link), so a clone and a wheel hold the
same files; `tests/test_wheel.py` copies and trains one from the wheel.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

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


def test_a_copy_never_writes_through_a_link(tmp_path, monkeypatch):
    """Issue 50: a dangling `recipes/<name>.yml` link made the copy create the link's target
    outside the folder, and with --force a link to a user's file replaced that file. A link is
    refused, naming it and where it points; --force replaces the link itself, and what it
    pointed to stays as it was (created nowhere, or unchanged)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    dangling, linked = tmp_path / "recipes" / "sppo-zero3.yml", tmp_path / "recipes" / "tiny-rrhf-cpu.yml"
    dangling.symlink_to("../outside/new.yml")
    mine = tmp_path / "mine.yml"
    mine.write_text("base_model: mine\n")
    linked.symlink_to(mine)
    for name, link, to in (
        ("sppo-zero3", dangling, "../outside/new.yml (which does not exist)"),
        ("tiny-rrhf-cpu", linked, mine),
    ):
        out = recipes(name)
        assert out.exit_code == 1
        assert out.output == (
            f"Error: recipes/{link.name} is a symbolic link to {to}: a copy never writes through a link. --force "
            f"replaces the link itself with the shipped {link.name}, leaving what it points to as it is\n"
        )
    assert not (tmp_path / "outside").exists() and mine.read_text() == "base_model: mine\n"
    assert not (tmp_path / "recipes" / "deepspeed").exists()  # every check before any write

    out = recipes("sppo-zero3", "tiny-rrhf-cpu", "--force")
    assert out.exit_code == 0, out.output
    for link in (dangling, linked):
        assert not link.is_symlink() and link.read_bytes() == (FOLDER / link.name).read_bytes()
    assert not (tmp_path / "outside").exists() and mine.read_text() == "base_model: mine\n"
    # a link to a file as shipped needs no write
    same = tmp_path / "same.yml"
    same.write_bytes((FOLDER / "tiny-rrhf-cpu.yml").read_bytes())
    linked.unlink()
    linked.symlink_to(same)
    assert recipes("tiny-rrhf-cpu").output == "wrote recipes/tiny-rrhf-cpu.yml (already there, unchanged)\n"


def test_a_copy_never_writes_into_a_linked_folder(tmp_path, monkeypatch):
    """`recipes/deepspeed` a link to a user's folder: the DeepSpeed config is not written there;
    --force replaces the link with a folder of its own, the user's folder left as it was."""
    monkeypatch.chdir(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "deepspeed").symlink_to(theirs)
    out = recipes("sppo-zero3")
    assert out.exit_code == 1
    assert out.output == (
        f"Error: recipes/deepspeed is a symbolic link to {theirs}: a copy never writes through a link. --force "
        "replaces the link itself with a folder, leaving what it points to as it is\n"
    )
    assert os.listdir(theirs) == [] and os.listdir(tmp_path / "recipes") == ["deepspeed"]
    assert recipes("sppo-zero3", "--force").exit_code == 0
    copied = tmp_path / "recipes" / "deepspeed" / "zero3_bf16.json"
    assert (
        not copied.parent.is_symlink()
        and copied.read_bytes() == (FOLDER / "deepspeed" / "zero3_bf16.json").read_bytes()
    )
    assert os.listdir(theirs) == []


def test_a_folder_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    """A read-only --to folder gave a raw OSError traceback; now a clear error names the file,
    the system's reason and what to do. (Run as root, which writes a 0555 folder anyway, the
    kernel's refusal to create a file there is stood in for at `open`.)"""
    import builtins
    import errno
    import io

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    real_open = io.open

    def refuse_in_folder(file, mode="r", *args, **kwargs):
        if "w" in mode and Path(file).parent.resolve() == folder:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", refuse_in_folder)
    monkeypatch.setattr(builtins, "open", refuse_in_folder)
    try:
        out = recipes("tiny-rrhf-cpu", "--to", "readonly")
    finally:
        monkeypatch.undo()
        folder.chmod(0o755)
    assert out.exit_code == 1
    assert out.output.startswith("Error: could not write readonly/tiny-rrhf-cpu.yml: Permission denied (errno 13).")
    assert out.output.endswith("Or copy into a folder you can write: --to DIR.\n")
    assert os.listdir(folder) == []  # nothing left behind


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
