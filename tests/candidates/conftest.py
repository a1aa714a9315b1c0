"""Shared fixtures: a tiny random policy and a tiny random reward model, built locally."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.vllm_server import VLLM_READY_TIMEOUT_S

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_policy(tiny_model) -> Path:
    return tiny_model


@pytest.fixture(scope="session")
def tiny_reward_model(tmp_path_factory) -> Path:
    """A random LlamaForSequenceClassification (1 label) with the tiny chat tokenizer."""
    import torch
    from transformers import LlamaForSequenceClassification

    from pofe.demo.tiny import build_config, build_tokenizer

    path = tmp_path_factory.mktemp("rm") / "tiny-rm"
    tok = build_tokenizer()
    cfg = build_config(tok, hidden_size=64, num_layers=1)
    cfg.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = LlamaForSequenceClassification(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def pair_reward_model(tiny_reward_model, tmp_path_factory) -> Path:
    """The tiny reward model without a chat template: it reads (prompt, response) sentence pairs."""
    import json
    import shutil

    path = tmp_path_factory.mktemp("rm-pair") / "rm"
    shutil.copytree(tiny_reward_model, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


# ---- a real vLLM (CPU) OpenAI-compatible server, from its own venv ------------------------


@pytest.fixture(scope="session")
def vllm_server(vllm_python, tiny_policy, tmp_path_factory):
    """Serve the tiny policy with vLLM's OpenAI server on 127.0.0.1; yields (base_url, model)."""
    from tests.vllm_server import vllm_server as serve

    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    # a server that exits or never gets ready errors the fixture, with its log's end
    with serve(vllm_python, str(tiny_policy), log_path, ready_timeout=VLLM_READY_TIMEOUT_S) as base:
        yield base, str(tiny_policy)
