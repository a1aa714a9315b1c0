"""POFE's INFO lines show under the axolotl CLI, which passes only `axolotl.*` at INFO."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import AXOLOTL_ENV, ROOT

MODULES = ("pofe.data.loader", "pofe.anchor.logps", "pofe.scoring", "pofe.quantization", "pofe.prefix")


def test_pofe_info_lines_show_under_axolotl_logging():
    """In a fresh process set up as the CLI sets itself up (`import axolotl.cli` runs
    `configure_logging`), every POFE logger's INFO line reaches stdout; before, the
    filter axolotl puts on non-`axolotl.*` loggers dropped them."""
    script = "import importlib, axolotl.cli\n" + "".join(
        f"importlib.import_module({m!r}).LOG.info('POFE probe from {m}')\n" for m in MODULES
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**_base_env(), **AXOLOTL_ENV},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    for m in MODULES:
        assert f"[INFO] [axolotl.integrations.{m}] POFE probe from {m}" in proc.stdout


def test_every_pofe_logger_is_named_under_axolotl():
    """A module taking axolotl's get_logger directly would log as `pofe.*` again."""
    root = ROOT
    direct = [
        str(p.relative_to(root))
        for folder in ("plugin", "preprocess")
        for p in (root / folder).rglob("*.py")
        if p.name != "logs.py"
        and (
            "from axolotl.utils.logging import get_logger" in p.read_text()
            or "logging.getLogger(__name__)" in p.read_text()
        )
    ]
    assert direct == [], "use pofe.logs.get_logger (preprocess: logger_name)"


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("AXOLOTL_LOG_LEVEL", "LOG_LEVEL")}
