"""Helpers for tests that run the real `axolotl` CLI on CPU recipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

# axolotl runs offline, on the CPU, without telemetry.
AXOLOTL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "WANDB_MODE": "disabled",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# Keys every CPU recipe needs (see docs in recipes/tiny-*-cpu.yml).
CPU_SETTINGS = {
    "bf16": False,
    "fp16": False,
    "tf32": False,
    "attn_implementation": "eager",
    "sample_packing": False,
    "optimizer": "adamw_torch",
    "dataloader_num_workers": 0,
    "lora_mlp_kernel": False,
    "lora_qkv_kernel": False,
    "lora_o_kernel": False,
    "lora_embedding_kernel": False,
}


def recipe(tmp_path: Path, model: Path, method: str, data: Path, dtype: str, **overrides) -> Path:
    """Write a CPU recipe for `method` on `data`; returns its path."""
    cfg = {
        "base_model": str(model),
        "plugins": ["pofe.PofePlugin"],
        "rl": method,
        "datasets": [{"path": str(data), "type": dtype}],
        "dataset_prepared_path": str(tmp_path / "prepared"),
        "output_dir": str(tmp_path / "out"),
        "sequence_len": 64,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "num_epochs": 1,
        "learning_rate": 3e-3,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "logging_steps": 1,
        "save_strategy": "epoch",
        "seed": 0,
        **CPU_SETTINGS,
        **overrides,
    }
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_axolotl(*args: str, cwd: Path | None = None, check: bool = True,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the real `axolotl` CLI of this environment (in-process launcher: 2 CPUs); `env`
    is added to its environment."""
    axolotl = Path(sys.executable).parent / "axolotl"
    extra = ["--launcher", "python"] if args[0] == "train" else []
    env = {**os.environ, **AXOLOTL_ENV, **(env or {})}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [str(axolotl), *args, *extra], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"axolotl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
        )
    return proc


def log_history(output_dir: Path) -> list[dict]:
    """The Trainer's log history from the last checkpoint's trainer_state.json."""
    states = sorted(
        output_dir.glob("checkpoint-*/trainer_state.json"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    assert states, f"no checkpoint with trainer_state.json under {output_dir}"
    return json.loads(states[-1].read_text())["log_history"]


def load_llama(path: Path, attn: str = "eager"):
    """A tiny Llama in float32 and train mode (dropout is 0: train mode exercises autograd)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.float32)
    return model.train()
