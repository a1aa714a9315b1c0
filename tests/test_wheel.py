"""What a user installs: POFE as `pip install .` installs it (a wheel, not editable).

`make test-newest` installs this checkout that way into its venv (the README's install line,
`pip install .`, with the `dev` extra) and runs these there, beside the tests marked `newest`,
which then run from the wheel too (`axolotl pofe run` of a one-round tiny recipe among them:
`tests/test_newest_axolotl.py`). `make test-main`, whose venv holds an editable install, leaves
them out. The checkout is not importable from their processes: its packages lie under
`plugin/` and `preprocess/`, never on the path, and the subprocesses start in a scratch folder
(`python -I`: no PYTHONPATH, no current folder).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest
import yaml

import pofe
from pofe.online.refresh import read_refresh
from pofe.records.refresh import FOLDER
from tests.helpers import ROOT, run_axolotl

SOURCE_FOLDERS = {"pofe": ROOT / "plugin" / "pofe", "pofe_candidates": ROOT / "preprocess" / "pofe_candidates"}
SHIPPED = ("*.py", "recipes/*.yml", "recipes/deepspeed/*.json")
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def checkout_files() -> dict[str, Path]:
    """What the wheel must hold: every module and shipped recipe, by its path in the wheel."""
    files = {}
    for package, folder in SOURCE_FOLDERS.items():
        for pattern in SHIPPED:
            for path in folder.rglob(pattern) if pattern == "*.py" else folder.glob(pattern):
                if "__pycache__" not in path.parts:
                    files[f"{package}/{path.relative_to(folder).as_posix()}"] = path
    return files


def installed_files() -> dict[str, Path]:
    """The installed distribution's files of POFE's two packages (its RECORD), by path."""
    dist = distribution("pofe")
    return {
        str(f): Path(dist.locate_file(f))
        for f in dist.files
        if f.parts[0] in SOURCE_FOLDERS and "__pycache__" not in f.parts
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.wheel
def test_pofe_is_this_checkout_installed_as_a_wheel():
    """Installed from this checkout, not editable, and holding exactly its modules and recipes,
    byte for byte (a stale install, or a module setuptools left out or packed from an old
    build/, fails here)."""
    dist = distribution("pofe")
    assert Path(dist.locate_file("")) == SITE_PACKAGES, f"pofe's metadata is read from {dist.locate_file('')}"
    origin = json.loads(dist.read_text("direct_url.json"))
    assert not origin.get("dir_info", {}).get("editable"), (
        f"pofe is installed editable ({origin}): these tests need `make test-newest`'s venv, where "
        "`pip install .` installs it as a wheel"
    )
    assert origin["url"] == ROOT.as_uri(), origin
    assert Path(pofe.__file__) == SITE_PACKAGES / "pofe" / "__init__.py"
    expected, installed = checkout_files(), installed_files()
    assert sorted(installed) == sorted(expected)
    stale = [name for name, path in expected.items() if sha256(path) != sha256(installed[name])]
    assert not stale, f"the installed files differ from the checkout: {stale}"


@pytest.mark.wheel
def test_sdist_and_wheel_build_and_pass_twine_check(tmp_path):
    """`python -m build` makes the sdist and, from it, the wheel; `twine check --strict` passes
    both (the metadata PyPI would take, the README as its long description); the wheel from the
    sdist holds what `pip install .` installed. Built from the files git lists (a clone's), copied:
    setuptools writes pofe.egg-info beside pyproject.toml, which on the path would shadow the
    installed metadata."""
    clone = tmp_path / "clone"
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        if (ROOT / name).exists() or (ROOT / name).is_symlink():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name, follow_symlinks=False)
    build = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(clone)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    sdist, wheel = sorted(tmp_path.glob("pofe-*.tar.gz")), sorted(tmp_path.glob("pofe-*.whl"))
    assert len(sdist) == len(wheel) == 1
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist[0]), str(wheel[0])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2, check.stdout
    names = {n for n in zipfile.ZipFile(wheel[0]).namelist() if n.split("/")[0] in SOURCE_FOLDERS}
    assert sorted(names) == sorted(installed_files())
    metadata = zipfile.ZipFile(wheel[0]).read("pofe-0.1.0.dist-info/entry_points.txt").decode()
    assert "pofe = pofe.cli:pofe" in metadata and "pofe = pofe:PofePlugin" in metadata


IMPORT_ALL = """
import importlib, json, pkgutil, sys
import pofe, pofe_candidates
names, failed = [], {}
for package in (pofe, pofe_candidates):
    names.append(package.__name__)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        names.append(info.name)
        try:
            importlib.import_module(info.name)
        except Exception as e:
            failed[info.name] = f"{type(e).__name__}: {e}"
print(json.dumps({"names": names, "failed": failed, "files": [pofe.__file__, pofe_candidates.__file__]}))
"""


@pytest.mark.wheel
def test_every_module_imports_from_the_wheel(tmp_path):
    """Each of POFE's modules, found in the installed packages, imports in a fresh interpreter
    started in a scratch folder (`-I`: neither PYTHONPATH nor that folder on the path)."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_ALL], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["failed"], result["failed"]
    modules = {name.replace(".", "/") for name in result["names"]}
    expected = {re.sub(r"(/__init__)?\.py$", "", name) for name in checkout_files() if name.endswith(".py")}
    assert modules == expected
    assert [Path(f) for f in result["files"]] == [SITE_PACKAGES / p / "__init__.py" for p in SOURCE_FOLDERS]


@pytest.mark.wheel
def test_the_demo_online_recipe_trains_from_the_wheel(tmp_path, monkeypatch):
    """A user of the wheel in an empty folder: `python -m pofe.demo --online --prepare-only`
    (the tiny model and prompts, from the packaged recipe), `axolotl pofe recipes
    tiny-rrhf-online-cpu` (the recipe, copied to recipes/), then `axolotl train` on it for 2
    epochs: 60 prompts in micro-batches of 20 make 3 steps an epoch, one refresh each
    (refresh_every 3), at steps 0 and 3, each sampling all 60 prompts."""
    from pofe.demo.__main__ import main

    monkeypatch.chdir(tmp_path)
    main(["--online", "--prepare-only"])
    copied = run_axolotl("pofe", "recipes", "tiny-rrhf-online-cpu", cwd=tmp_path)
    assert "wrote recipes/tiny-rrhf-online-cpu.yml" in copied.stdout
    recipe = tmp_path / "recipes" / "tiny-rrhf-online-cpu.yml"
    run_axolotl("train", str(recipe.relative_to(tmp_path)), "--num-epochs", "2", cwd=tmp_path)
    output_dir = tmp_path / yaml.safe_load(recipe.read_text())["output_dir"]
    refreshes = sorted((output_dir / FOLDER).glob("refresh-*"))
    assert [p.name for p in refreshes] == ["refresh-0000000", "refresh-0000003"]
    stats = [read_refresh(folder)[2] for folder in refreshes]
    assert [int(s["prompts"]) for s in stats] == [60, 60]
    assert (output_dir / "model.safetensors").exists()
