"""LoRA / QLoRA between rounds: the adapter merged into the round's base.

peft's `merge_and_unload` adds the adapter to the base, saved as a full model that
becomes the next round's `base_model` (with a fresh adapter). QLoRA trains its adapter
against the NF4-quantised base, but the merge loads the base in floating point (bf16/fp16
as the recipe trains, else float32) and adds the adapter there; the next round quantises
the merged model again. The difference (the adapter saw quantised weights) is the usual
QLoRA-merge caveat.

The runner calls the merge as its own process (so its memory goes when it ends):

    python -m pofe.run.merge BASE ADAPTER OUT DTYPE
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def merge_dtype(raw: dict) -> str:
    """The float dtype the merge loads the base in: the recipe's training precision."""
    import torch

    bf16, fp16 = raw.get("bf16"), raw.get("fp16")
    if bf16 is True or (bf16 == "auto" and torch.cuda.is_available()):
        return "bfloat16"
    if fp16 is True:
        return "float16"
    return "float32"


def merge_adapter(base: str, adapter: str, out: str, dtype: str = "float32") -> None:
    """peft's merge_and_unload of `adapter` into `base` (loaded in `dtype`, never quantised),
    saved with the tokenizer as a full model at `out` (written to a temporary folder first)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_path = Path(out)
    tmp = out_path.with_name(out_path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model.save_pretrained(tmp)
    tokenizer_dir = adapter if (Path(adapter) / "tokenizer_config.json").exists() else base
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
    shutil.rmtree(out_path, ignore_errors=True)
    os.replace(tmp, out_path)


def merge_command(base: str, adapter: str, out: str, dtype: str) -> list[str]:
    """The command line of the runner's merge stage."""
    return [sys.executable, "-m", "pofe.run.merge", base, adapter, out, dtype]


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: python -m pofe.run.merge BASE ADAPTER OUT DTYPE")
    merge_adapter(*sys.argv[1:])
