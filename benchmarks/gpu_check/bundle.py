"""The wheels the one-GPU check needs on the GPU machine this project can be lent, and the
command lines that run it there.

    python -m benchmarks.gpu_check.bundle          # download into .whl/, check the sizes, print the calls
    python -m benchmarks.gpu_check.bundle --check  # the same without downloading (what .whl/ holds now)

That machine (`gpu_machine.txt`: Python 3.12.3, torch 2.11.0+cu130, transformers 5.17.0, peft,
accelerate, ...) has no axolotl, trl, datasets or bitsandbytes, and fetches nothing: what it
lacks travels as wheels beside the working tree, at most 64 MiB together a call, installed
there with `pip install --no-index --no-deps --target`. `WHEELS` is that set: axolotl 0.19.0
(the newest release that accepts torch 2.11) and what importing and training through it needs,
found by running the check's `--tiny` path in a venv holding only that machine's packages
(`benchmarks.gpu_check.clean_venv`). One version of each; versions that axolotl 0.19.0 does not
pin are those of the project's own venv, which the tests pass on.

Two wheels are not PyPI's files as they are: the axolotl-contribs packages are published as
sdists only (built here with `pip wheel`), and bitsandbytes carries a library for every CUDA and
ROCm release (43 MB): its copy keeps those for CUDA 13 (the machine's torch is cu130) and the
CPU, which its own loader picks from, and nothing else changes (RECORD lists what is kept).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 64 * 2**20  # the working tree plus what a call carries
MEASURED_BYTES = 50_184_175  # .whl as assembled on 2026-12-03 (47.9 MiB): the room the tree must leave it
GPU_PYTHON = "3.12"
MACHINE = Path(__file__).with_name("gpu_machine.txt")
# name: (version, why it travels)
WHEELS = {
    "axolotl": ("0.19.0", "the newest axolotl that accepts torch 2.11 (0.20 and later need torch >= 2.13)"),
    "axolotl-contribs-lgpl": ("0.0.7", "axolotl.train imports it (axolotl 0.19.0's pin; an sdist on PyPI)"),
    "axolotl-contribs-mit": ("0.0.6", "axolotl.train imports it (axolotl 0.19.0's pin; an sdist on PyPI)"),
    "trl": ("1.9.0", "axolotl's trainers (axolotl 0.19.0's pin)"),
    "datasets": ("4.8.4", "axolotl's and POFE's data loading (axolotl 0.19.0's pin)"),
    "dill": ("0.4.1", "datasets"),
    "multiprocess": ("0.70.19", "datasets"),
    "bitsandbytes": ("0.50.2", "QLoRA's 4-bit layers (axolotl 0.19.0's pin); CUDA 13 and CPU libraries only"),
    "peft": ("0.20.0", "there already, at a version nobody has read: carried at axolotl 0.19.0's pin"),
    "pydantic": ("2.12.5", "axolotl's config schema (axolotl 0.19.0's pin)"),
    "pydantic-core": ("2.41.5", "pydantic 2.12.5's pin"),
    "annotated-types": ("0.8.0", "pydantic"),
    "typing-inspection": ("0.4.5", "pydantic"),
    "pydantic-extra-types": ("2.11.1", "mistral_common, which transformers' Voxtral processor imports"),
    "pycountry": ("26.2.16", "pydantic_extra_types.language_code, imported by mistral_common"),
    "mistral-common": ("1.11.5", "axolotl 0.19.0's pin; the check's tokenizer is its Mistral v0.2 file"),
    "fire": ("0.7.1", "axolotl.cli.train"),
    "termcolor": ("3.3.0", "fire"),
    "addict": ("2.4.0", "axolotl.utils.dict"),
    "python-dotenv": ("1.0.1", "axolotl.cli.main (axolotl 0.19.0's pin)"),
    "posthog": ("6.7.11", "axolotl.telemetry (axolotl 0.19.0's pin; AXOLOTL_DO_NOT_TRACK keeps it silent)"),
    "backoff": ("2.2.1", "posthog"),
    "distro": ("1.9.0", "posthog"),
    "fastcore": ("2.2.41", "axolotl.utils.model_shard_quant"),
    "evaluate": ("0.4.1", "axolotl.utils.callbacks (axolotl 0.19.0's pin)"),
    "wandb": ("0.31.0", "axolotl.utils.callbacks imports it (WANDB_MODE=disabled)"),
    "platformdirs": ("4.14.9", "wandb"),
    "opentelemetry-api": ("1.45.2", "wandb"),
    "opentelemetry-sdk": ("1.45.2", "wandb"),
    "opentelemetry-semantic-conventions": ("0.66b2", "wandb"),
}
BUILT_HERE = {"axolotl-contribs-lgpl", "axolotl-contribs-mit"}  # no wheel on PyPI
SLIM = {"bitsandbytes": ("bitsandbytes/libbitsandbytes_cpu.", "bitsandbytes/libbitsandbytes_cuda13")}
PREINSTALLED_ON_PURPOSE = {"peft"}  # there already; carried so the run does not depend on its version
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]


@dataclass(frozen=True)
class Call:
    """One command on the GPU machine: the check's stages it runs, its limit (the tool's
    timeout_s) and the machine minutes expected (an estimate until a GPU has run it)."""

    name: str
    stages: tuple[str, ...]
    timeout_s: int
    minutes: float


# The trainers' numbers first; a second call for the rest, so that either can be run again within
# the 15 minutes: ~1.5 (start) + 3 + 6.5 leaves ~4 (the online stage's two runs, RRHF and Nash-MD:
# ~1 minute each, estimated).
CALLS = (
    Call("train", ("train",), timeout_s=480, minutes=3.0),
    Call("rest", ("online", "generate", "vllm", "prefix", "speed", "judges"), timeout_s=540, minutes=6.5),
)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_project(filename: str) -> tuple[str, str]:
    """(normalised name, version) of a wheel file name."""
    name, version = Path(filename).name.split("-")[:2]
    return normalise(name), version


def machine_packages() -> dict[str, str | None]:
    """The GPU machine's packages (`MACHINE`): normalised name -> version where it was read, else None."""
    out = {}
    for line in MACHINE.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[normalise(name)] = version or None
    return out


def download(cache: Path, python_version: str) -> None:
    """Every wheel of WHEELS into `cache` as PyPI has it (pip skips files already there)."""
    cache.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    wanted = [f"{n}=={v}" for n, (v, _) in WHEELS.items() if n not in BUILT_HERE]
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run(
        [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python_version]
        + ["--implementation", "cp", *platforms, "-d", str(cache), *wanted],
        check=True,
    )
    built = [f"{n}=={WHEELS[n][0]}" for n in sorted(BUILT_HERE)]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(cache), *built], check=True)


def slim(source: Path, dest: Path, keep: tuple[str, ...]) -> None:
    """`source` without its native libraries (`*.so`) but those starting with one of `keep`, its
    RECORD listing what is left (pip installs what the archive holds and rewrites RECORD)."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        names = zin.namelist()
        dropped = {n for n in names if n.endswith(".so") and not n.startswith(keep)}
        for name in names:
            if name in dropped:
                continue
            data = zin.read(name)
            if name.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if line.split(",")[0] not in dropped).encode()
            zout.writestr(zin.getinfo(name), data)


def pofe_wheel(dest: Path) -> Path:
    """POFE itself, built from this working tree (the GPU machine runs the tree's benchmarks/ and
    tests/ beside it)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(ROOT)], check=True)
        (built,) = Path(tmp).glob("pofe-*.whl")
        return Path(shutil.copy(built, dest))


def assemble(cache: Path, dest: Path) -> list[Path]:
    """`dest` holds exactly the bundle: each of WHEELS from `cache` (slimmed where SLIM says) and POFE's."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    for source in sorted(cache.glob("*.whl")):
        name, version = wheel_project(source.name)
        if WHEELS.get(name, (None,))[0] != version:
            continue  # another version of a project left in the cache
        if name in SLIM:
            slim(source, dest / source.name, SLIM[name])
        else:
            shutil.copy(source, dest / source.name)
    pofe_wheel(dest)
    return sorted(dest.glob("*.whl"))


def problems(wheels: list[Path]) -> list[str]:
    """What is wrong with a bundle: a project missing, twice, unknown, or one the GPU machine
    already has (unless carried on purpose)."""
    found: dict[str, list[str]] = {}
    for w in wheels:
        name, version = wheel_project(w.name)
        found.setdefault(name, []).append(version)
    out = [f"{n}: {len(v)} versions {v} (one stops the whole install)" for n, v in found.items() if len(v) > 1]
    out += [f"{n}=={v} missing" for n, (v, _) in WHEELS.items() if n not in found]
    out += [f"{n}: not in WHEELS" for n in found if n not in WHEELS and n != "pofe"]
    there = machine_packages()
    out += [f"{n}: the GPU machine has it" for n in found if n in there and n not in PREINSTALLED_ON_PURPOSE]
    return out


def tree_bytes(root: Path = ROOT) -> int:
    """What travels from the working tree: tracked files and untracked ones git does not ignore
    (a symbolic link as a link)."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    paths = (root / p for p in listed.decode().split("\0") if p)
    return sum(p.lstat().st_size for p in paths if os.path.lexists(p))


def command(
    call: Call,
    *,
    python: str = "python3",
    wheels: str = ".whl",
    site: str = "/tmp/site",
    work: str = "/tmp/pofe-gpu-check",
    tiny: bool = False,
) -> str:
    """The command line of `call`, run in the repository root with `wheels` carried: install the
    bundle into `site`, run the check's stages, JSON and log into $OUT, and the runs' logs and
    recipes as one archive (the tool brings back 8 files)."""
    install = (
        f"{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
        f"--target {site} {wheels}/*.whl && export PYTHONPATH={site} || exit"
    )
    check = (
        f"set -o pipefail; PYTHON={python} WORK={work} PYTHONUNBUFFERED=1 benchmarks/gpu_check.sh"
        f"{' --tiny' if tiny else ''} --stages {','.join(call.stages)} --out $OUT/gpu-check-{call.name}.json "
        f"2>&1 | tee $OUT/gpu-check-{call.name}.log; rc=$?"
    )
    logs = (
        f"(cd {work} && find . -name '*.log' -o -name '*.yml' | grep -v /checkpoint- "
        f"| tar czf $OUT/work-{call.name}.tgz -T -); exit $rc"
    )
    return f"{install}; {check}; {logs}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="download nothing: check and print what --dest holds")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="the carried folder (git-ignored)")
    parser.add_argument("--cache", type=Path, default=None, help="PyPI's files (default .whl-cache/py<version>)")
    parser.add_argument("--python-version", default=GPU_PYTHON, help="the interpreter the wheels are for")
    args = parser.parse_args(argv)

    if not args.check:
        cache = args.cache or ROOT / ".whl-cache" / f"py{args.python_version}"
        download(cache, args.python_version)
        assemble(cache, args.dest)
    wheels = sorted(args.dest.glob("*.whl"))
    wrong = problems(wheels)
    carried, tree = sum(w.stat().st_size for w in wheels), tree_bytes()
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    for w in sorted(wheels, key=lambda w: -w.stat().st_size):
        print(f"{mib(w.stat().st_size):>10}  {w.name}")
    print(f"{mib(carried):>10}  {len(wheels)} wheels in {args.dest}; the working tree {mib(tree)}")
    over = carried + tree > LIMIT
    if abs(carried - MEASURED_BYTES) > 2**20 and args.python_version == GPU_PYTHON:
        print(f"bundle: {carried:_} bytes now, MEASURED_BYTES says {MEASURED_BYTES:_}: update it", file=sys.stderr)
    print(f"{mib(carried + tree):>10}  each call carries (limit {mib(LIMIT)}){': OVER' if over else ''}")
    for line in wrong:
        print(f"bundle: {line}", file=sys.stderr)
    if over or wrong:
        return 1
    if args.python_version != GPU_PYTHON:
        return 0  # for this machine's Python (clean_venv): no command for the GPU machine
    rel = os.path.relpath(args.dest, ROOT)
    print(f"\nOn the GPU machine, one call after the other (carry: [{rel!r}]); ~1.5 min to start, then:")
    for call in CALLS:
        print(f"\n# {call.name}: stages {', '.join(call.stages)}; ~{call.minutes:g} min, timeout_s {call.timeout_s}")
        print(command(call, wheels=rel))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
