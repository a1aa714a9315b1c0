"""Online RRHF (`pofe.online`) through the real `axolotl train`, QLoRA with the KL penalty: the
training model samples its own candidates on the GPU every few steps, the adapter-disabled base
scores them as pi_0, and each refresh is written before it is trained on.

What the run must show:
- it finishes, with one refresh per `refresh_every` steps, each of `PROMPTS_PER_REFRESH` prompts;
- at the first refresh the adapted policy is its base (LoRA's B starts at 0), so every
  candidate's log-prob under the policy equals pi_0's: a gap means the sampling pass, the
  adapter-disabled pass or QLoRA's 4-bit layers (issue 10's repack) disagree. Tolerance as the
  train stage's step-1 log-ratio: 4 eps(dtype) sqrt(L) m per candidate, L its tokens, m the
  size of one token's log-prob;
- the policy has moved from pi_0 by the last refresh (`online/kl_to_pi_0` > 0);
- no 4-bit repack warning in the log.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import yaml

from benchmarks.gpu_check.train import EPS, REPACK_WARNING, TIMEOUT_S, device_settings, launch, wait
from pofe.args.translate import LORA_KERNELS

MICRO_BATCH = 4
REFRESH_EVERY = 2
STEPS = 6
PROMPTS_PER_REFRESH = MICRO_BATCH * REFRESH_EVERY


def recipe(out: Path, model: Path, cuda: bool) -> Path:
    """Online RRHF with QLoRA on the demo's addition prompts, judged by its verifiable reward."""
    from pofe.demo.task import make_prompt_rows, write_jsonl

    prompts = write_jsonl(make_prompt_rows(MICRO_BATCH * STEPS, k_wrong=1, seed=0), out / "prompts.jsonl")
    cfg = {
        "base_model": str(model),
        "plugins": ["pofe.PofePlugin"],
        "rl": "rrhf",
        "datasets": [{"path": str(prompts), "type": "pofe.prompts"}],
        "dataset_prepared_path": str(out / "prepared"),
        "output_dir": str(out / "rrhf-qlora-online"),
        "adapter": "qlora",
        "load_in_4bit": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "lora_target_linear": True,
        **dict.fromkeys(LORA_KERNELS, False),
        "pofe": {
            "online": {"refresh_every": REFRESH_EVERY, "kl_coef": 0.01},
            "generate": {
                "backend": "transformers",
                "num_candidates": 4,
                "temperature": 1.0,
                "max_new_tokens": 32 if cuda else 8,
                "include_dataset_responses": ["answer"],
            },
            "judge": {"type": "python", "function": "pofe.demo.task:reward"},
        },
        "sequence_len": 256,
        "micro_batch_size": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "num_epochs": 1,
        "learning_rate": 2e-3,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "optimizer": "adamw_torch",
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": STEPS,
        "save_only_model": True,
        "seed": 0,
        **device_settings(cuda),
    }
    path = out / "rrhf-qlora-online.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(out: Path, model: Path, cuda: bool) -> dict:
    """The online run and what its refreshes and log say."""
    out.mkdir(parents=True, exist_ok=True)
    path = recipe(out, model, cuda)
    output = Path(yaml.safe_load(path.read_text())["output_dir"])
    shutil.rmtree(output, ignore_errors=True)  # an earlier check's refreshes must not stand in
    rc = wait(launch(path), time.monotonic() + (TIMEOUT_S if cuda else 3 * TIMEOUT_S))
    log = path.with_suffix(".log").read_text()
    result = {
        "recipe": str(path),
        "log": str(path.with_suffix(".log")),
        "returncode": rc,
        "dtype": "bfloat16" if cuda else "float32",
    }
    if rc != 0:
        return {**result, "error": log[-2000:]}
    refreshes = [json.loads((d / "refresh.json").read_text()) for d in sorted((output / "online").glob("refresh-*"))]
    first = [
        json.loads(line) for line in (output / "online" / "refresh-0000000" / "rows.jsonl").read_text().splitlines()
    ]
    state = output / f"checkpoint-{STEPS}" / "trainer_state.json"
    steps = [h for h in json.loads(state.read_text())["log_history"] if "loss" in h]
    return {
        **result,
        "refresh_steps": [r["start_step"] for r in refreshes],
        "refresh_prompts": [r["stats"]["prompts"] for r in refreshes],
        "kl_to_pi_0": [r["stats"].get("kl_to_pi_0") for r in refreshes],
        "generate_seconds": [r["stats"]["generate_seconds"] for r in refreshes],
        "first_refresh_gaps": first_refresh_gaps(first, result["dtype"]),
        "losses": [h["loss"] for h in steps],
        "repack_warning": REPACK_WARNING in log,
        "peak_gpu_gib": max((h.get("memory/max_allocated (GiB)", 0.0) for h in steps), default=None) or None,
    }


def first_refresh_gaps(rows: list[dict], dtype: str) -> dict:
    """The largest |log pi - log pi_0| at the first refresh, over its tolerance (`module docstring`)."""
    worst = 0.0
    for r in rows:
        for logp, base, ids in zip(r["logp"], r["pi_0_logps"], r["tokens"]["response_ids"]):
            length = max(1, len(ids))
            tolerance = 4 * EPS[dtype] * math.sqrt(length) * max(abs(base) / length, 1e-3)
            worst = max(worst, abs(logp - base) / tolerance)
    return {"worst_over_tolerance": worst, "candidates": sum(len(r["logp"]) for r in rows)}


def checks(r: dict) -> list[dict]:
    """The table's row for the online run."""
    from benchmarks.gpu_check.report import row

    name = "online rrhf-qlora (kl_coef 0.01)"
    if r["returncode"] != 0:
        why = "was killed at the stage's time limit" if r["returncode"] == -9 else f"exited {r['returncode']}"
        return [row(name, "FAIL", f"axolotl train {why}, see {r['log']}")]
    gaps = r["first_refresh_gaps"]
    expected = list(range(0, STEPS, REFRESH_EVERY))
    ok = (
        r["refresh_steps"] == expected
        and all(p == PROMPTS_PER_REFRESH for p in r["refresh_prompts"])
        and gaps["worst_over_tolerance"] <= 1.0
        and (r["kl_to_pi_0"][-1] or 0.0) > 0.0
        and not r["repack_warning"]
        and all(map(math.isfinite, r["losses"]))
    )
    detail = (
        f"refreshes at steps {r['refresh_steps']}; first refresh: pi = pi_0 on {gaps['candidates']} candidates, "
        f"worst gap {gaps['worst_over_tolerance']:.2f} x tolerance; KL to pi_0 at the last refresh "
        f"{r['kl_to_pi_0'][-1]:.3g}; repack warning: {r['repack_warning']}"
    )
    return [row(name, "pass" if ok else "FAIL", detail)]
