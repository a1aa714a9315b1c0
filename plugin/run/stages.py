"""Running one stage of a run as its own process, its output in a log file.

Every stage is a separate process, so generation and training never share one (nor their
GPU memory).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

Echo = Callable[[str], None]


class StageFailed(RuntimeError):
    """A stage's process exited with an error."""


def child_env() -> dict[str, str]:
    """The children's environment: this venv's bin first (`axolotl train` runs `accelerate`)."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def axolotl_command(*args: str) -> list[str]:
    """`axolotl ARGS...` from this environment (or `python -m axolotl.cli.main` without the script)."""
    exe = Path(sys.executable).parent / "axolotl"
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "axolotl.cli.main", *args]


def run_logged(cmd: list[str], log: Path, echo: Echo, stream: bool) -> None:
    """Run `cmd`; its output goes to `log` (and the terminal when `stream`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(f"$ {' '.join(cmd)}   (log: {log})")
    with log.open("w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            if stream:
                sys.stdout.write(line)
        returncode = proc.wait()
    if returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        raise StageFailed(f"{' '.join(cmd)} exited with {returncode}; last lines of {log}:\n{tail}")
