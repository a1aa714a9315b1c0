"""Online Nash-MD (`rl: nash_md`) through the real `axolotl train`, QLoRA: each refresh the training
model samples the policy's responses and, token by token with its adapter disabled for pi_0's
logits, the mixture's opponents on the GPU (`pofe.online.mixture`); a judge that prefers the
longer response (`length_reward`, sharp preferences) judges each pair.

What the run must show (the CPU's tiny path runs the same code):
- it finishes, with one refresh per `refresh_every` steps, each of `PROMPTS_PER_REFRESH` prompts;
- at the first refresh the adapted policy is its base (LoRA's B starts at 0): every sample's
  log-prob under the policy equals pi_0's (`online.first_refresh_gaps`' tolerance), and the
  mixture is the policy: its per-token KL from the policy is float32 rounding of identical
  log-softmaxes (below `MIXTURE_KL_AT_START`; 4-bit layers with B = 0 add exact zeros);
- by the last refresh the policy has moved from pi_0 (`online/kl_to_pi_0` > 0) and so the mixture
  from the policy (`online/mixture_kl` > `MIXTURE_KL_AT_START`);
- the losses are finite and no 4-bit repack warning is in the log.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import yaml

from benchmarks.gpu_check.online import MICRO_BATCH, PROMPTS_PER_REFRESH, REFRESH_EVERY, STEPS, first_refresh_gaps
from benchmarks.gpu_check.online import recipe as online_recipe
from benchmarks.gpu_check.train import REPACK_WARNING, TIMEOUT_S, launch, wait

MIXTURE_KL_AT_START = 1e-4


def length_reward(prompt, response: str) -> float:
    """The response's length in characters: a judge with something to say about a random model's
    samples, which the toy's verifier scores 0 alike (every preference 1/2: no gradient at all)."""
    return float(len(response))


def recipe(out: Path, model: Path, cuda: bool) -> Path:
    """The online stage's QLoRA recipe as Nash-MD: the policy's own samples only, each against an
    opponent of the mixture (beta 0.125), the longer one preferred (`length_reward`, hard)."""
    cfg = yaml.safe_load(online_recipe(out, model, cuda).read_text())
    cfg["rl"] = "nash_md"
    cfg["output_dir"] = str(out / "nash-md-qlora-online")
    generate = {k: v for k, v in cfg["pofe"]["generate"].items() if k != "include_dataset_responses"}
    cfg["pofe"] = {
        "nash_md": {"mixture_coef": 0.125},
        "online": {"refresh_every": REFRESH_EVERY, "kl_coef": 0.1},
        "generate": generate,
        "judge": {"type": "python", "function": "benchmarks.gpu_check.nash_md:length_reward", "preferences": "hard"},
    }
    path = out / "nash-md-qlora-online.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(out: Path, model: Path, cuda: bool) -> dict:
    """The Nash-MD run and what its refreshes and log say."""
    out.mkdir(parents=True, exist_ok=True)
    path = recipe(out, model, cuda)
    output = Path(yaml.safe_load(path.read_text())["output_dir"])
    shutil.rmtree(output, ignore_errors=True)  # an earlier check's refreshes must not stand in
    rc = wait(launch(path), time.monotonic() + (TIMEOUT_S if cuda else 3 * TIMEOUT_S))
    log = path.with_suffix(".log").read_text()
    dtype = "bfloat16" if cuda else "float32"
    result = {"recipe": str(path), "log": str(path.with_suffix(".log")), "returncode": rc, "dtype": dtype}
    if rc != 0:
        return {**result, "error": log[-2000:]}
    refreshes = [json.loads((d / "refresh.json").read_text()) for d in sorted((output / "online").glob("refresh-*"))]
    rows = (output / "online" / "refresh-0000000" / "rows.jsonl").read_text().splitlines()
    state = output / f"checkpoint-{STEPS}" / "trainer_state.json"
    steps = [h for h in json.loads(state.read_text())["log_history"] if "loss" in h]
    return {
        **result,
        "refresh_steps": [r["start_step"] for r in refreshes],
        "refresh_prompts": [r["stats"]["prompts"] for r in refreshes],
        **{key: [r["stats"].get(key) for r in refreshes] for key in ("kl_to_pi_0", "mixture_kl", "preference")},
        "generate_seconds": [r["stats"]["generate_seconds"] for r in refreshes],
        "first_refresh_gaps": first_refresh_gaps([json.loads(line) for line in rows], dtype),
        "losses": [h["loss"] for h in steps],
        "repack_warning": REPACK_WARNING in log,
        "peak_gpu_gib": max((h.get("memory/max_allocated (GiB)", 0.0) for h in steps), default=None) or None,
    }


def checks(r: dict) -> list[dict]:
    """The table's row for the Nash-MD run."""
    from benchmarks.gpu_check.report import row

    name = "online nash_md-qlora (mixture 0.125)"
    if r["returncode"] != 0:
        why = "was killed at the stage's time limit" if r["returncode"] == -9 else f"exited {r['returncode']}"
        return [row(name, "FAIL", f"axolotl train {why}, see {r['log']}")]
    gaps, mixture = r["first_refresh_gaps"], r["mixture_kl"]
    ok = (
        r["refresh_steps"] == list(range(0, STEPS, REFRESH_EVERY))
        and all(p == PROMPTS_PER_REFRESH for p in r["refresh_prompts"])
        and gaps["worst_over_tolerance"] <= 1.0
        and abs(mixture[0]) < MIXTURE_KL_AT_START < mixture[-1]
        and (r["kl_to_pi_0"][-1] or 0.0) > 0.0
        and not r["repack_warning"]
        and all(map(math.isfinite, r["losses"]))
    )
    detail = (
        f"refreshes at steps {r['refresh_steps']} of {MICRO_BATCH} x {REFRESH_EVERY} prompts; first refresh: pi = "
        f"pi_0 on {gaps['candidates']} samples, worst gap {gaps['worst_over_tolerance']:.2f} x tolerance, mixture's "
        f"KL from the policy {mixture[0]:.2g} per token; last: {mixture[-1]:.3g}, KL to pi_0 "
        f"{r['kl_to_pi_0'][-1]:.3g}, preference {r['preference'][-1]:.3f}; repack warning: {r['repack_warning']}"
    )
    return [row(name, "pass" if ok else "FAIL", detail)]
