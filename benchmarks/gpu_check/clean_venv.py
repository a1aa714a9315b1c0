"""The bundle shown to work without a GPU: a venv like the GPU machine's, the bundle installed in
it by the command the GPU machine runs, and the check's `--tiny` CPU path run in it.

    python -m benchmarks.gpu_check.clean_venv     # venv ~5 min the first time; the check 3-7 min on 2 cores

The venv (`.venv-gpu-like`, git-ignored) holds only packages the GPU machine has
(`gpu_machine.txt`; anything else pip brings along is removed, and the venv is checked): BASE,
the ones the check and axolotl import, at that machine's versions where they were read and
install here. Where they differ: this machine's Python is 3.11 (the machine's 3.12.3), and its
torch is the CPU build of 2.13.0 that lies on this disk (the machine's is 2.11.0+cu130; a 2.11
CPU wheel is not reachable here, and a CUDA one is gigabytes); transformers is the machine's
5.17.0. The bundle is `benchmarks.gpu_check.bundle`'s set, downloaded for Python 3.11 (the same
versions; the binary wheels, pydantic_core and multiprocess, in their 3.11 builds) into
`.whl-py311`, and installed and run by `bundle.command`, as on the GPU machine, with the stages
of both calls but vLLM's (the machine has none). Output: `benchmarks/results/clean-venv/`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_check import bundle

VENV = bundle.ROOT / ".venv-gpu-like"
PYTHON = "python3.11"
BASE = [
    "torch==2.13.0",
    "triton==3.6.0",
    "transformers==5.17.0",
    "accelerate==1.15.0",
    "huggingface-hub==1.33.0",
    "tokenizers==0.23.2",
    "safetensors==0.8.0",
    "sentencepiece==0.2.2",
    "peft",
    "numpy",
    "pyarrow",
    "pandas",
    "requests",
    "xxhash",
    "pyyaml",
    "protobuf",
    "numba",
    "colorama",
    "six",
    "einops",
    "matplotlib",
    "pytest",
]
STAGES = tuple(s for call in bundle.CALLS for s in call.stages if s != "vllm")


def foreign(python: Path) -> list[str]:
    """Distributions in `python`'s environment that the GPU machine does not have."""
    script = "from importlib.metadata import distributions as d; print('\\n'.join(x.metadata['Name'] for x in d()))"
    names = subprocess.run([str(python), "-I", "-c", script], check=True, capture_output=True, text=True).stdout
    there = bundle.machine_packages()
    return sorted({n for n in names.split() if bundle.normalise(n) not in there})


def build_venv() -> Path:
    """The venv, built once per BASE (a marker file holds the list it was built from)."""
    python, marker = VENV / "bin" / "python", VENV / ".base"
    if marker.exists() and marker.read_text() == "\n".join(BASE):
        return python
    subprocess.run([PYTHON, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-U", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *BASE], check=True)
    extra = foreign(python)  # e.g. pydantic, which typer brings along here
    if extra:
        subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", *extra], check=True)
    marker.write_text("\n".join(BASE))
    return python


def main() -> int:
    t0 = time.time()
    python = build_venv()
    extra = foreign(python)
    if extra:
        sys.exit(f"{VENV} holds packages the GPU machine has not: {extra}")
    wheels = bundle.ROOT / ".whl-py311"
    if bundle.main(["--python-version", "3.11", "--dest", str(wheels)]) != 0:
        return 1
    out = bundle.ROOT / "benchmarks" / "results" / "clean-venv"
    out.mkdir(parents=True, exist_ok=True)
    t1 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        call = bundle.Call("tiny", STAGES, timeout_s=0, minutes=0)
        line = bundle.command(
            call, python=str(python), wheels=wheels.name, site=f"{tmp}/site", work=f"{tmp}/work", tiny=True
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env |= {"OUT": str(out), "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}
        rc = subprocess.run(["bash", "-c", line], cwd=bundle.ROOT, env=env).returncode
    report = json.loads((out / "gpu-check-tiny.json").read_text())
    counts = {s: sum(r["status"] == s for r in report["rows"]) for s in ("pass", "FAIL", "measured")}
    print(
        f"\nclean venv ({report['python']}, {', '.join(f'{k} {v}' for k, v in report['versions'].items())}): "
        f"exit {rc}, {counts}; the check {time.time() - t1:.0f} s, all {time.time() - t0:.0f} s; {out}"
    )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
