"""`make demo` as the README runs it, in a scratch folder: what tests of the demo read.

The folder holds a copy of `recipes/`, the Makefile and pyproject.toml, and a `.venv` whose
parts are this environment's (linked) with a `.installed` of its own, so `make demo` finds the
install done and runs the demo with this environment's POFE, writing only under the folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.doc_blocks import shell_block
from tests.helpers import AXOLOTL_ENV, ROOT


@dataclass(frozen=True)
class DemoConsole:
    """A finished `make demo`: its folder, exit status, console (stdout and stderr as a terminal
    shows them, interleaved), wall time, and the demo's results (`demo-results.json`)."""

    root: Path
    returncode: int
    console: str
    seconds: float

    @property
    def demo(self) -> Path:
        return self.root / "outputs" / "demo"

    @property
    def results(self) -> dict:
        return json.loads((self.demo / "demo-results.json").read_text())

    def run(self, title: str) -> dict:
        """One recipe's results (`RRHF`, `SPPO online`, ...)."""
        (found,) = [r for r in self.results["runs"] if r["title"] == title]
        return found


def scratch_checkout(root: Path) -> None:
    """`root` laid out for `make`: recipes copied; Makefile and pyproject.toml linked; a `.venv`
    of links to this environment's, marked installed after pyproject.toml."""
    shutil.copytree(ROOT / "recipes", root / "recipes")
    for name in ("Makefile", "pyproject.toml"):
        (root / name).symlink_to(ROOT / name)
    venv, here = root / ".venv", Path(sys.prefix)
    venv.mkdir()
    for part in here.iterdir():
        if part.name != ".installed":
            (venv / part.name).symlink_to(part)
    (venv / ".installed").touch()


def run_make_demo(root: Path) -> DemoConsole:
    """The README's `make demo` line, as written, in a scratch checkout at `root`."""
    scratch_checkout(root)
    command = shell_block("README.md", "make demo").text
    # the real model's part (the Makefile's DEMO_REAL) is left out: tests/real/test_demo_real.py runs it
    env = {**os.environ, **AXOLOTL_ENV, "DEMO_REAL": ""}
    start = time.perf_counter()
    proc = subprocess.run(
        ["bash", "-e", "-c", command], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return DemoConsole(root, proc.returncode, proc.stdout, time.perf_counter() - start)
