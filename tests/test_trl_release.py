"""Which TRL the tests marked `trl` run on: axolotl's pin, or, in `make test-newest`'s second
run, the newest release over it (`TRL_NEWEST` in the Makefile, named to the tests by
`POFE_TRL_UNDER_TEST`). A run that meant to test a TRL and imported another fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import requires, version

import pytest

pytestmark = pytest.mark.trl


def test_the_trl_under_test_is_imported_here_and_in_subprocesses():
    (pin,) = [r for r in requires("axolotl") if r.replace(" ", "").startswith("trl==")]
    expected = os.environ.get("POFE_TRL_UNDER_TEST") or pin.split("==")[1].split(";")[0].strip()
    import trl

    assert version("trl") == trl.__version__ == expected
    # what `axolotl train` and `axolotl pofe run` import: this environment, PYTHONPATH included
    child = subprocess.run(
        [sys.executable, "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True, timeout=300
    )
    assert child.stdout.strip() == expected, child.stderr[-2000:]
