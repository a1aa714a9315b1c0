"""Shared fixtures: a tiny local model and k-response datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

from pofe.demo.task import make_rrhf_rows, make_sppo_rows, write_jsonl
from pofe.demo.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny64_model(tmp_path_factory) -> Path:
    """A narrower tiny model (hidden 64) for the many forward/backward comparisons."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny64") / "model", hidden_size=64)


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
