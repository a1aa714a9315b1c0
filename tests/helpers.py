"""Helpers for tests that run the real `axolotl` CLI on CPU recipes."""

from __future__ import annotations

import json
import math
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


def run_axolotl(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real `axolotl` CLI of this environment (in-process launcher: 2 CPUs); `env`
    is added to its environment."""
    axolotl = Path(sys.executable).parent / "axolotl"
    extra = ["--launcher", "python"] if args[0] == "train" else []
    env = {**os.environ, **AXOLOTL_ENV, **(env or {})}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [str(axolotl), *args, *extra],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"axolotl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
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


def float_tolerance(dtype, n_terms: int, magnitude: float = 1.0, c: float = 4.0) -> dict[str, float]:
    """`rtol`/`atol` for two computations of one float quantity that differ in the order of
    their sums (prefix-shared vs unshared, chunked vs whole, KV cache vs packed, FSDP vs one
    process), as `torch.testing.assert_close` takes them.

    Each rounding of a sum of `n_terms` terms of size about `magnitude` errs by up to
    eps / 2 times the partial sum, eps = `torch.finfo(dtype).eps` (float32: 1.19e-7,
    bfloat16: 7.8e-3). Taken as independent, the errors add up like a random walk, to about
    eps * sqrt(n) * magnitude; all in one direction (the worst case) they reach
    eps * n * magnitude. Two orders of the same sum differ by about as much. A value or
    gradient of a small transformer sums over the width H at each matmul and, for a
    weight's gradient, over every token of the batch, so n ~ H * tokens; the few matmuls in
    series add a constant factor, `c`.

    Returns rtol = c * eps * sqrt(n) and atol = rtol * magnitude (the scale of the whole
    tensor, for its elements near zero). Measured on the 64-wide tiny model (130 tokens,
    n = 8320, bound 365 eps * max|ref| at c = 4): the worst of tests/test_prefix_sharing.py
    and tests/test_scoring.py differed by 12 eps * max|ref| on AVX-512 (with and without
    ATEN_CPU_CAPABILITY=avx2/default); the CI failure that the old fixed 1e-5 met (1.3e-5
    on a LoRA gradient of max 1.46) is ~75 eps * max|ref|, still 5x inside. The bound stays
    far below what a bug moves: a token scored at a rotary position off by one, or one
    token of a batch dropped, misses it by 1e2-1e4 times.
    """
    import torch

    eps = torch.finfo(dtype).eps
    rtol = c * eps * math.sqrt(n_terms)
    return {"rtol": rtol, "atol": rtol * float(magnitude)}


def approx_float(expected: float, n_terms: int, scale: float = 1.0):
    """`pytest.approx` for a float32 scalar computed two ways (batched and padded vs alone, a
    judge vs a hand-written forward): `float_tolerance(float32, n_terms, scale)`. `scale` is
    the size of the terms summed last: 1 for a score read off layer-normed hidden states
    (O(1) entries), |expected| for a sum of log-probs."""
    import pytest
    import torch

    tol = float_tolerance(torch.float32, n_terms, scale)
    return pytest.approx(expected, rel=tol["rtol"], abs=tol["atol"])


def assert_float_close(actual, expected, n_terms: int, msg=None, **kwargs) -> None:
    """`torch.testing.assert_close` at `float_tolerance(expected.dtype, n_terms, max|expected|)`;
    non-finite entries (NaN for an unwritten slot) must match."""
    import torch

    finite = expected[expected.isfinite()]
    magnitude = finite.abs().max().item() if finite.numel() else 0.0
    tol = float_tolerance(expected.dtype, n_terms, magnitude)
    torch.testing.assert_close(actual, expected, **tol, equal_nan=True, msg=msg, **kwargs)


def prompts_stage(tmp_path: Path, method: str, pool: Path, pofe: dict) -> tuple:
    """An iterated run's prompts stage (`prepare_prompts`) on the `pofe.prompts` file `pool`
    with the `pofe:` block `pofe`, in tmp_path/run: (folder, state, the lines it echoed)."""
    from axolotl.utils.dict import DictDefault

    from pofe.args import pofe_config
    from pofe.run.folder import RunFolder, RunState
    from pofe.run.rounds.loop import prepare_prompts
    from pofe.run.rounds.runner import StageRunner

    cfg = DictDefault(
        {"rl": method, "datasets": [DictDefault({"path": str(pool), "type": "pofe.prompts"})], "pofe": pofe}
    )
    folder = RunFolder(tmp_path / "run")
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method=method)
    said: list[str] = []
    prepare_prompts(cfg, pofe_config(cfg), folder, StageRunner(state, echo=said.append))
    return folder, state, said


def prompts_in(path: Path) -> list:
    """The `prompt` of each row of a JSONL prompt file."""
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines()]
