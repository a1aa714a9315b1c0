"""SPPO and RRHF through the real `axolotl train`: full fine-tuning, and QLoRA with axolotl's LoRA
kernels off and on (six runs side by side on the one GPU).

What each run must show:
- SPPO's step-1 log-ratio is 0: the anchor table and the first training forward score the same
  adapter-free policy (LoRA's B starts at 0), so any other value means the anchor pass and the
  training forward see different weights or kernels (issue 10's repacked 4-bit layers did that).
  Full fine-tuning too: no step has run when the table is made.
  Tolerance: each response token's log-prob rounds once, by eps(dtype) times its size m; L
  tokens of such errors add up like a random walk: 4 eps sqrt(L) m, m = |logps/chosen| / L.
- QLoRA kernels on equal kernels off: `loss` and `logps/chosen` at every step within
  rtol = 4 eps(bf16) = 0.031 (the kernels reorder bf16 matmuls and fuse their casts). axolotl's
  kernels are Triton: on the CPU the kernels-on runs are `needs GPU`.
- No 4-bit repack: POFE's warning that a no-grad pass had repacked 4-bit layers for
  bitsandbytes' CPU inference kernel (`pofe.quantization`) is absent from the log.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pofe.args.translate import LORA_KERNELS

EPS = {"bfloat16": 2.0**-7, "float32": 2.0**-23}
KERNEL_RTOL = 4 * EPS["bfloat16"]
REPACK_WARNING = "repacked for bitsandbytes"
TIMEOUT_S = 360  # all runs together: about 2 minutes on an H200 (estimated); a timed-out run FAILs
# (method, adapter, LoRA kernels): the runs, named as `run_name` writes them
RUNS = [(m, a, k) for m in ("sppo", "rrhf") for a, k in (("full", False), ("qlora", False), ("qlora", True))]
# the CPU path (2 cores, the test's time): one QLoRA run (SPPO's: its anchor pass is where 4-bit
# layers were repacked) and one full fine-tuning; the kernels-on runs need CUDA
CPU_RUNS = {("sppo", "qlora", False), ("rrhf", "full", False)}
ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}


def write_data(out: Path, method: str, rows: int) -> Path:
    from pofe.demo.task import make_rrhf_rows, make_sppo_rows, write_jsonl

    return write_jsonl(
        (make_rrhf_rows if method == "rrhf" else make_sppo_rows)(rows, k=4, seed=0), out / f"{method}.jsonl"
    )


def run_name(method: str, adapter: str, kernels: bool) -> str:
    return f"{method}-full" if adapter == "full" else f"{method}-{adapter}-kernels-{'on' if kernels else 'off'}"


def device_settings(cuda: bool) -> dict:
    """What every run of the check sets by device: bf16, sdpa and gradient checkpointing on CUDA;
    float32 and eager attention on the CPU."""
    return {
        "bf16": cuda,
        "fp16": False,
        "tf32": False,
        "attn_implementation": "sdpa" if cuda else "eager",
        "sample_packing": False,
        "dataloader_num_workers": 0,
        "gradient_checkpointing": cuda,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
    }


def recipe(out: Path, model: Path, method: str, adapter: str, kernels: bool, steps: int, cuda: bool) -> Path:
    """The recipe of one run (`adapter`: full or qlora); also what `plan` estimates (with a
    generate and judge section added)."""
    micro = 4
    data = write_data(out, method, steps * micro)
    name = run_name(method, adapter, kernels)
    qlora = dict(
        adapter="qlora", load_in_4bit=True, lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_target_linear=True
    )
    cfg = {
        "base_model": str(model),
        "plugins": ["pofe.PofePlugin"],
        "rl": method,
        "datasets": [{"path": str(data), "type": f"pofe.{method}"}],
        "dataset_prepared_path": str(out / "prepared" / name),
        "output_dir": str(out / name),
        **(qlora if adapter == "qlora" else {}),
        **dict.fromkeys(LORA_KERNELS, kernels),
        "sequence_len": 256,
        "micro_batch_size": micro,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": 2e-4,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "optimizer": "adamw_torch",
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": steps,
        "save_only_model": True,  # trainer_state.json is what is read; full fine-tuning's optimizer state is 2x the model
        "seed": 0,
        **device_settings(cuda),
        "pofe": {"eta": 10.0} if method == "sppo" else {},
    }
    path = out / f"{name}.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def launch(path: Path) -> subprocess.Popen:
    """`axolotl train` on `path` in one process (the python launcher), its log beside it. Run as
    `python -m axolotl.cli.main`: where the bundle is installed with `pip --target` (the GPU
    machine) no `axolotl` script sits beside the interpreter."""
    env = {**os.environ, **ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = path.with_suffix(".log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "axolotl.cli.main", "train", str(path), "--launcher", "python"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def mean_response_tokens(path: Path) -> float:
    """L: response tokens per candidate in the prepared rows (what a log-prob sums over)."""
    from datasets import load_from_disk

    cfg = yaml.safe_load(path.read_text())
    prepared = next(p for p in Path(cfg["dataset_prepared_path"]).iterdir() if p.is_dir())
    lengths = [len(r) for rows in load_from_disk(str(prepared))["response_ids"] for r in rows]
    return sum(lengths) / len(lengths)


def result(path: Path, rc: int) -> dict:
    """Losses, step-1 log-ratio and its tolerance, peak memory and the repack warning of a run."""
    log = path.with_suffix(".log").read_text()
    out = {"recipe": str(path), "log": str(path.with_suffix(".log")), "returncode": rc}
    if rc != 0:
        return {**out, "error": log[-2000:]}
    cfg = yaml.safe_load(path.read_text())
    state = Path(cfg["output_dir"]) / f"checkpoint-{cfg['max_steps']}" / "trainer_state.json"
    steps = [h for h in json.loads(state.read_text())["log_history"] if "loss" in h]
    dtype = "bfloat16" if cfg["bf16"] else "float32"
    first, length = steps[0], mean_response_tokens(path)
    out.update(
        losses=[h["loss"] for h in steps],
        logps_chosen=[h["logps/chosen"] for h in steps],
        repack_warning=REPACK_WARNING in log,
        dtype=dtype,
        response_tokens=length,
        peak_gpu_gib=max((h.get("memory/max_allocated (GiB)", 0.0) for h in steps), default=None) or None,
    )
    if cfg["rl"] == "sppo":
        per_token = abs(first["logps/chosen"]) / length
        out["step1_logratio"] = first["sppo/logratio"]
        out["step1_logratio_tolerance"] = 4 * EPS[dtype] * math.sqrt(length) * per_token
    return out


def kernels_equal(on: dict, off: dict) -> tuple[bool, float]:
    """Every step's loss and logps/chosen agree within KERNEL_RTOL; the largest relative gap."""
    gaps = [abs(a - b) / max(abs(b), 1e-12) for key in ("losses", "logps_chosen") for a, b in zip(on[key], off[key])]
    return len(on["losses"]) == len(off["losses"]) and max(gaps) <= KERNEL_RTOL, max(gaps)


def run_all(out: Path, model: Path, steps: int, cuda: bool) -> dict:
    """Every run at once (separate processes; an H200 holds six 1B runs: two full fine-tunings of
    ~10 GB and four QLoRA runs of ~3 GB), then their results; on the CPU, CPU_RUNS."""
    runs = {run_name(*r): recipe(out, model, *r, steps, cuda) for r in RUNS if cuda or r in CPU_RUNS}
    for path in runs.values():  # a checkpoint left by an earlier check must not stand in for this run's
        shutil.rmtree(yaml.safe_load(path.read_text())["output_dir"], ignore_errors=True)
    procs = {name: launch(path) for name, path in runs.items()}
    deadline = time.monotonic() + (TIMEOUT_S if cuda else 3 * TIMEOUT_S)  # on the CPU, only a hang guard
    return {name: result(path, wait(procs[name], deadline)) for name, path in runs.items()}


def wait(proc: subprocess.Popen, deadline: float) -> int:
    """The run's exit status; killed (status -9) once the stage's deadline has passed."""
    try:
        return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9


def checks(results: dict) -> list[dict]:
    """The table's rows for the training runs."""
    from benchmarks.gpu_check.report import row

    rows = []
    for method in ("sppo", "rrhf"):
        for name in (run_name(method, a, k) for m, a, k in RUNS if m == method):
            r = results.get(name)
            if r is None and name.endswith("kernels-on"):
                rows.append(row(f"train {name}", "needs GPU", "axolotl's LoRA kernels are Triton (CUDA)"))
                continue
            if r is None:
                rows.append(row(f"train {name}", "skipped: the CPU path runs one full and one QLoRA run"))
                continue
            if r["returncode"] != 0:
                why = "was killed at the stage's time limit" if r["returncode"] == -9 else f"exited {r['returncode']}"
                rows.append(row(f"train {name}", "FAIL", f"axolotl train {why}, see {r['log']}"))
                continue
            finite = all(map(math.isfinite, r["losses"]))
            ok = finite and not r["repack_warning"] and len(r["losses"]) > 0
            detail = (
                f"{len(r['losses'])} steps, last loss {r['losses'][-1]:.4f}, repack warning: {r['repack_warning']}"
            )
            if method == "sppo":
                ok = ok and abs(r["step1_logratio"]) <= r["step1_logratio_tolerance"]
                detail += (
                    f"; step-1 log-ratio {r['step1_logratio']:.2e} (tolerance {r['step1_logratio_tolerance']:.1e})"
                )
            rows.append(row(f"train {name}", "pass" if ok else "FAIL", detail))
        on, off = results.get(run_name(method, "qlora", True)), results.get(run_name(method, "qlora", False))
        if on is None or off is None:
            rows.append(row(f"train {method} qlora kernels on == off", "needs GPU", "kernels-on needs CUDA"))
        elif on["returncode"] or off["returncode"]:
            rows.append(row(f"train {method} qlora kernels on == off", "FAIL", "a run failed"))
        else:
            ok, gap = kernels_equal(on, off)
            rows.append(
                row(
                    f"train {method} qlora kernels on == off",
                    "pass" if ok else "FAIL",
                    f"loss and logps/chosen, every step: largest relative gap {gap:.2e} "
                    f"(rtol {KERNEL_RTOL:.3f} = 4 eps(bf16))",
                )
            )
    return rows
