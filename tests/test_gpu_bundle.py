"""The wheels and commands that run the one-GPU check on the lent GPU machine
(`benchmarks.gpu_check.bundle`), checked without downloading them: the set (one version each,
nothing that machine already has unless carried on purpose), the slimmed bitsandbytes wheel,
the 64 MiB a call carries, and the command lines. That the set is what the check imports is
`python -m benchmarks.gpu_check.clean_venv`'s to show: it installs the bundle in a venv holding
only that machine's packages and runs the check's --tiny path there (minutes: not a test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from benchmarks.gpu_check import bundle
from benchmarks.gpu_check.__main__ import STAGES


def fake_wheels(folder, sizes=None):
    """One empty file per wheel of the bundle, named as pip saves them (`sizes`: name -> bytes)."""
    folder.mkdir(exist_ok=True)
    for name, (version, _) in {**bundle.WHEELS, "pofe": ("0.1.0", "")}.items():
        path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with path.open("wb") as f:
            f.truncate((sizes or {}).get(name, 0))  # sparse: the size is what is counted
    return folder


def test_each_wheel_is_missing_on_the_gpu_machine_or_carried_on_purpose():
    there = bundle.machine_packages()
    assert there["torch"] == "2.11.0" and there["transformers"] == "5.17.0"  # what the bundle is built for
    carried = {bundle.normalise(n) for n in bundle.WHEELS}
    assert carried & set(there) == bundle.PREINSTALLED_ON_PURPOSE
    assert bundle.BUILT_HERE <= carried and set(bundle.SLIM) <= carried


def test_problems_names_a_second_version_a_missing_wheel_and_a_preinstalled_one(tmp_path):
    folder = fake_wheels(tmp_path / "w")
    assert bundle.problems(sorted(folder.glob("*.whl"))) == []
    (folder / "trl-1.13.0-py3-none-any.whl").touch()
    (folder / "fire-0.7.1-py3-none-any.whl").unlink()
    (folder / "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl").touch()
    found = bundle.problems(sorted(folder.glob("*.whl")))
    assert "trl: 2 versions ['1.13.0', '1.9.0'] (one stops the whole install)" in found
    assert "fire==0.7.1 missing" in found
    assert "torch: not in WHEELS" in found and "torch: the GPU machine has it" in found


def test_the_size_limit_counts_the_tree_and_every_wheel(tmp_path, capsys):
    """Under 64 MiB with the tree: the calls are printed; a MiB over: refused, nothing printed."""
    room = bundle.LIMIT - bundle.tree_bytes()
    folder = fake_wheels(tmp_path / "fits", {"bitsandbytes": room - 2**20})
    assert bundle.main(["--check", "--dest", str(folder)]) == 0
    out = capsys.readouterr().out
    carried = os.path.relpath(folder, bundle.ROOT)  # carry names a path in the repository
    assert "OVER" not in out and all(bundle.command(c, wheels=carried) in out for c in bundle.CALLS)
    folder = fake_wheels(tmp_path / "over", {"bitsandbytes": room + 2**20})
    assert bundle.main(["--check", "--dest", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "OVER" in out and "--target" not in out


def test_the_calls_run_every_stage_once_trainers_first_within_the_budget():
    """The check's stages split over the calls, `train` alone first; each command fits the tool
    (2,000 characters, 600 s) and its expected minutes; start + both calls within 11 minutes."""
    stages = [s for c in bundle.CALLS for s in c.stages]
    assert sorted(stages) == sorted(STAGES) and bundle.CALLS[0].stages == ("train",)
    assert 1.5 + sum(c.minutes for c in bundle.CALLS) <= 11
    for call in bundle.CALLS:
        line = bundle.command(call)
        assert len(line) <= 2000 and call.minutes * 60 < call.timeout_s <= 600
        assert line.startswith(
            "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
            "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit;"
        )
        assert f"--stages {','.join(call.stages)} --out $OUT/gpu-check-{call.name}.json" in line
        assert "--tiny" not in line and line.endswith("exit $rc")


def test_the_tree_leaves_room_for_the_bundle():
    """The working tree and the bundle as last assembled (`MEASURED_BYTES`) fit one call: a large
    file added to the repository would leave the GPU machine without axolotl."""
    assert bundle.tree_bytes() + bundle.MEASURED_BYTES <= bundle.LIMIT


def _wheel(path, files: dict[str, bytes]):
    record = "".join(f"{n},,\n" for n in files) + "bnb-0.1.dist-info/RECORD,,\n"
    meta = {
        "bnb-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: bnb\nVersion: 0.1\n",
        "bnb-0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, data in {**files, **meta}.items():
            z.writestr(name, data)
        z.writestr("bnb-0.1.dist-info/RECORD", record + "".join(f"{n},,\n" for n in meta))


def test_slim_keeps_the_cuda13_and_cpu_libraries_and_installs(tmp_path):
    """Of bitsandbytes' per-release libraries only CUDA 13's and the CPU's stay, in the archive
    and in RECORD; pip installs the result as the GPU command does."""
    libs = ["cpu", "cuda128", "cuda130", "cuda132", "rocm64", "xpu2025"]
    files = {f"bnb/libbitsandbytes_{x}.so": x.encode() for x in libs} | {"bnb/__init__.py": b""}
    _wheel(tmp_path / "big.whl", files)
    slim_path = tmp_path / "bnb-0.1-py3-none-any.whl"
    bundle.slim(tmp_path / "big.whl", slim_path, ("bnb/libbitsandbytes_cpu.", "bnb/libbitsandbytes_cuda13"))
    kept = {"bnb/__init__.py", *(f"bnb/libbitsandbytes_{x}.so" for x in ("cpu", "cuda130", "cuda132"))}
    with zipfile.ZipFile(slim_path) as z:
        assert {n for n in z.namelist() if n.startswith("bnb/")} == kept
        record = {line.split(",")[0] for line in z.read("bnb-0.1.dist-info/RECORD").decode().splitlines()}
    assert {n for n in record if n.startswith("bnb/")} == kept
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target"]
        + [str(site), str(slim_path)],
        check=True,
    )
    assert sorted(p.name for p in (site / "bnb").iterdir()) == sorted(n.split("/")[1] for n in kept)
    assert (site / "bnb" / "libbitsandbytes_cuda130.so").read_bytes() == b"cuda130"


@pytest.mark.parametrize("name", ["bitsandbytes", "axolotl-contribs-lgpl", "pydantic-core", "python-dotenv"])
def test_wheel_file_names_give_the_project(name):
    version = bundle.WHEELS[name][0]
    assert bundle.wheel_project(f"{name.replace('-', '_')}-{version}-cp312-cp312-manylinux_2_17_x86_64.whl") == (
        name,
        version,
    )
