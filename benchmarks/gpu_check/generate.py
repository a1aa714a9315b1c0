"""K = 5 samples for 64 prompts given as token ids, and issue 18's prompt-identity check: the
engine conditioned every prompt on exactly the ids the trainer conditions on (`render_prompt`, as
`pofe.data.tokenize` tokenises; `check_prompt_seen` on what the engine reports back), which start
with one BOS.

Two engines, two stages:
- `generate`: POFE's transformers backend (`pofe_candidates.generators.hf.sample_responses`, the
  loop the trainer-side stages and evaluation use), which needs nothing beyond torch and
  transformers, so it runs wherever the check does; its peak memory goes beside the plan's.
- `vllm`: vLLM in its own venv (`VLLM_PYTHON`, else `$VLLM_VENV/bin/python`, else `.venv-vllm`,
  else this python if it imports vllm) through `vllm_driver.py`; the same prompts sent as text
  must show two BOS, or this tokenizer does not exercise the hazard the check exists for.
  Without a vLLM (the lent GPU machine has none, and its wheel cannot travel) the row is `skipped`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROMPTS, K = 64, 5
UTILIZATION = 0.3  # vLLM's share of the GPU (the plan is given the same): 42 GB of an H200
MAX_MODEL_LEN = 1024
TIMEOUT_S = 300  # start, CUDA graphs and 64 x 5 samples: about 1.5 minutes on an H200
BATCH = 16  # transformers: prompts per generate call (x K sequences)
NO_VLLM = "no vLLM here (set VLLM_PYTHON or VLLM_VENV); the lent GPU machine has none and its wheel cannot travel"


def vllm_python() -> str | None:
    candidates = [
        os.environ.get("VLLM_PYTHON"),
        os.environ.get("VLLM_VENV") and f"{os.environ['VLLM_VENV']}/bin/python",
        ".venv-vllm/bin/python",
        sys.executable,
    ]
    for py in filter(None, candidates):
        if Path(py).exists() and subprocess.run([py, "-c", "import vllm"], capture_output=True).returncode == 0:
            return py
    return None


def prompt_ids(tokenizer) -> list[list[int]]:
    """The trainer's ids of the check's 64 chat prompts (the demo task's questions)."""
    from pofe.demo.task import make_rrhf_rows
    from pofe_candidates.render import render_prompt

    rows = make_rrhf_rows(PROMPTS, k=2, seed=1)
    return [list(render_prompt(tokenizer, [{"role": "user", "content": f"What is {r['prompt']}"}]).ids) for r in rows]


def settings(max_tokens: int, backend: str, max_prompt_tokens: int | None = None) -> dict:
    """The generate section `plan` estimates the same run from."""
    if backend == "vllm":
        return {
            "backend": "vllm",
            "num_candidates": K,
            "max_new_tokens": max_tokens,
            "vllm_kwargs": {"gpu_memory_utilization": UTILIZATION, "max_model_len": MAX_MODEL_LEN},
        }
    return {
        "backend": "transformers",
        "num_candidates": K,
        "max_new_tokens": max_tokens,
        "batch_size": BATCH,
        "max_prompt_tokens": max_prompt_tokens,
    }


def run_transformers(model_dir: Path, tokenizer, max_tokens: int, cuda: bool) -> dict:
    """POFE's transformers backend on the check's prompts: what it conditioned on, its samples,
    its seconds and (CUDA) the allocator's peak, weights included."""
    import torch

    from pofe_candidates.config import Sampling
    from pofe_candidates.generators.hf import sample_responses
    from pofe_candidates.models import load_policy

    sent = prompt_ids(tokenizer)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = load_policy(str(model_dir), device="cuda" if cuda else "cpu")  # the checkpoint's bf16 / float32
    sampling = Sampling(temperature=0.7, top_p=0.9, max_new_tokens=max_tokens)
    start = time.perf_counter()
    samples = sample_responses(model, tokenizer, sent, K, sampling, batch_size=BATCH)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del model
    if cuda:
        torch.cuda.empty_cache()
    return {
        "sent": sent,
        "seen": [row[0].prompt_ids for row in samples],
        "samples": [[s.response_ids for s in row] for row in samples],
        "seconds": seconds,
        "peak_gpu_gib": peak,
        "max_prompt_tokens": max(map(len, sent)),
    }


def run_vllm(out: Path, model: Path, tokenizer, max_tokens: int, cuda: bool) -> dict:
    """vLLM's result with the ids sent, or {"skipped": why}."""
    py = vllm_python()
    if py is None:
        return {"skipped": NO_VLLM}
    sent = prompt_ids(tokenizer)
    request = {
        "model": str(model),
        "prompts": sent,
        "n": K,
        "max_tokens": max_tokens,
        "enforce_eager": not cuda,
        "gpu_memory_utilization": UTILIZATION,
        "max_model_len": MAX_MODEL_LEN,
    }
    (out / "vllm-request.json").write_text(json.dumps(request))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    timeout = TIMEOUT_S if cuda else 3 * TIMEOUT_S  # on the CPU, only a hang guard
    try:
        proc = subprocess.run(
            [
                py,
                str(Path(__file__).with_name("vllm_driver.py")),
                str(out / "vllm-request.json"),
                str(out / "vllm-result.json"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"vLLM did not finish in {timeout} s"}
    (out / "vllm.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"error": f"vLLM exited {proc.returncode}: {proc.stderr[-1500:]}"}
    return {**json.loads((out / "vllm-result.json").read_text()), "sent": sent}


def identity_row(name: str, res: dict, bos: int, **values) -> dict:
    """`name` passes when every prompt was seen as sent, with one BOS, and has K samples."""
    from benchmarks.gpu_check.report import row
    from pofe_candidates.generators.interface import check_prompt_seen

    problems = []
    for i, (sent, seen) in enumerate(zip(res["sent"], res["seen"])):
        try:
            check_prompt_seen(sent, seen, name, i)
        except ValueError as err:
            problems.append(str(err)[:160])
    one_bos = sum(ids[:2].count(bos) == 1 for ids in res["seen"])
    complete = sum(len(s) == K and all(s) for s in res["samples"])
    tokens = sum(len(c) for s in res["samples"] for c in s)
    ok = not problems and len(res["seen"]) == PROMPTS and one_bos == PROMPTS and complete == PROMPTS
    return row(
        f"{name} K={K} x {PROMPTS} from token ids",
        "pass" if ok else "FAIL",
        f"{PROMPTS - len(problems)}/{PROMPTS} prompts seen as sent, {one_bos} with one BOS, {complete} with "
        f"{K} samples; {tokens / res['seconds']:,.0f} generated tok/s" + (f"; {problems[0]}" if problems else ""),
        tokens_per_second=tokens / res["seconds"],
        **values,
    )


def transformers_checks(res: dict, bos: int) -> list[dict]:
    return [identity_row("transformers", res, bos, peak_gpu_gib=res["peak_gpu_gib"])]


def vllm_checks(res: dict, bos: int) -> list[dict]:
    from benchmarks.gpu_check.report import row

    name = f"vLLM K={K} x {PROMPTS} from token ids"
    if "skipped" in res:
        return [row(name, f"skipped: {res['skipped']}")]
    if "error" in res:
        return [row(name, "FAIL", res["error"].splitlines()[-1][:200])]
    two_bos_as_text = sum(ids[:2] == [bos, bos] for ids in res["text_seen"])
    return [
        identity_row("vLLM", res, bos, device_used_gib=res["device_used_gib"]),
        row(
            "vLLM text prompts double BOS",
            "pass" if two_bos_as_text == PROMPTS else "FAIL",
            f"{two_bos_as_text}/{PROMPTS} text prompts got two BOS (the hazard the id prompts avoid)",
        ),
    ]
