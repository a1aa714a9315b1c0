"""A generation backend that cannot run here is refused when the recipe is read, with POFE's
install line (`pofe_candidates.generators.available`), not at the first shard or refresh."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml

from pofe_candidates.config import GenerateConfig
from pofe_candidates.generators.available import VLLM_INSTALL, BackendUnavailable, check_backend_runs
from tests.helpers import ROOT, run_axolotl


def _vllm(monkeypatch, installed: bool, cuda: bool) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (real("json") if installed else None) if name == "vllm" else real(name, *a),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)


def test_the_readme_names_the_install_line():
    """The refusal's install line is the README's, as written in its Install section."""
    install = next(line for line in (ROOT / "README.md").read_text().splitlines() if "# + vLLM generation" in line)
    assert install.split("#")[0].strip() == VLLM_INSTALL


@pytest.mark.parametrize("online", [False, True])
def test_vllm_absent(monkeypatch, online):
    _vllm(monkeypatch, installed=False, cuda=True)
    with pytest.raises(
        BackendUnavailable, match=r"this environment has no vllm: install POFE with it, `pip install '.\[vllm\]'`"
    ) as e:
        check_backend_runs(GenerateConfig(backend="vllm"), online=online)
    assert ("generate.backend: transformers" in str(e.value)) == online and "trl[vllm]" not in str(e.value)
    check_backend_runs(GenerateConfig(backend="transformers"), online=online)  # needs nothing of the venv


def test_colocated_vllm_needs_a_gpu(monkeypatch):
    _vllm(monkeypatch, installed=True, cuda=False)
    check_backend_runs(GenerateConfig(backend="vllm"), online=False)  # offline: vLLM's CPU build may run it
    with pytest.raises(
        BackendUnavailable, match="colocated.*this machine has no CUDA GPU: set generate.backend: transformers"
    ):
        check_backend_runs(GenerateConfig(backend="vllm"), online=True)
    _vllm(monkeypatch, installed=True, cuda=True)
    check_backend_runs(GenerateConfig(backend="vllm"), online=True)


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="this venv has vLLM: nothing to refuse")
def test_axolotl_train_of_an_online_vllm_recipe_is_refused_before_its_model_loads(tmp_path, tiny_model):
    """The tiny online recipe with `generate.backend: vllm`, in this venv (no vLLM): `axolotl
    train` stops at the recipe's datasets, before a model loads or output_dir is written, with
    POFE's message and install line, not TRL's "pip install trl[vllm]" at the first refresh."""
    from pofe.demo.task import make_prompt_rows, write_jsonl

    raw = yaml.safe_load((ROOT / "recipes" / "tiny-rrhf-online-cpu.yml").read_text())
    raw |= {
        "base_model": str(tiny_model),
        "datasets": [{"path": str(write_jsonl(make_prompt_rows(20), tmp_path / "p.jsonl")), "type": "pofe.prompts"}],
        "dataset_prepared_path": str(tmp_path / "prepared"),
        "output_dir": str(tmp_path / "out"),
    }
    raw["pofe"]["generate"]["backend"] = "vllm"
    (tmp_path / "r.yml").write_text(yaml.safe_dump(raw))
    proc = run_axolotl("train", str(tmp_path / "r.yml"), check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "pofe.online with generate.backend: vllm runs vLLM in each training process" in said
    assert f"`{VLLM_INSTALL}`" in said and "trl[vllm]" not in said
    assert not list((tmp_path / "out").glob("checkpoint-*")) and not (tmp_path / "out" / "online").exists()


def test_axolotl_pofe_run_refuses_a_vllm_backend_before_its_first_stage(monkeypatch):
    """The run's first check (`check_iterable`, before the prompts stage) asks the backend."""
    from axolotl.utils.dict import DictDefault

    from pofe.args import PofeConfig
    from pofe.run.rounds.loop import check_iterable
    from tests.helpers import pofe_block

    _vllm(monkeypatch, installed=False, cuda=False)
    block = pofe_block("rrhf")
    block["generate"]["backend"] = "vllm"
    cfg = DictDefault({"datasets": [DictDefault({"type": "pofe.prompts", "path": "p.jsonl"})]})
    with pytest.raises(BackendUnavailable, match="or sample from a vLLM in a venv of its own: generate.serve"):
        check_iterable(cfg, PofeConfig.model_validate({"method": "rrhf", **block}))
    block["generate"]["backend"] = "transformers"
    check_iterable(cfg, PofeConfig.model_validate({"method": "rrhf", **block}))
