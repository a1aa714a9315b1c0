"""The CPU benchmark's step-time ratios and tokens/s (`benchmarks.run`) on this machine: full
fine-tuning of TinyLlama's shape in bf16 with sdpa on CUDA, the tiny model in float32 on the CPU.
Rows report figures (`measured`), with `benchmarks.run.TARGETS` met or MISSED: a speed target
is not a correctness check.

MFU of POFE's step (forward, loss and backward of the layout `auto` picks), per workload: model
FLOPs over the step's median time, over the dense matmul rate measured here in the same run (a
square product of `MATMUL_N` in the step's dtype; the device README's ceiling) and, on an H100 or
H200, over the datasheet's dense bf16 rate. Model FLOPs count what a training step must compute,
not what this one recomputes: 6 x the decoder layers' parameters x the unique tokens (each
prompt once, then its k responses), plus 6 x the output layer's parameters x the response tokens
(the only positions scored). Attention's score products are left out (a few percent at these lengths),
and so are the chunked head's recomputed logits.
"""

from __future__ import annotations

from pathlib import Path

MATMUL_N = {True: 8192, False: 512}
DATASHEET_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12}  # dense, SXM


def run(out: Path, cuda: bool) -> dict:
    import json

    from benchmarks import run as bench

    path = out / "speed.json"
    args = (
        ["--device", "cuda", "--model", "1b", "--dtype", "bf16", "--reps", "3"]
        if cuda
        else ["--device", "cpu", "--model", "tiny", "--quick", "--reps", "1", "--workloads", "sppo-pairs"]
    )
    bench.main([*args, "--modes", "full", "--out", str(path)])
    return {**json.loads(path.read_text()), "matmul_flops": matmul_rate(cuda)}


def matmul_rate(cuda: bool, reps: int = 10) -> float:
    """FLOP/s of a square matmul in the step's dtype on random data, median of `reps` after warm-up."""
    import statistics
    import time

    import torch

    n, device = MATMUL_N[cuda], "cuda" if cuda else "cpu"
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16 if cuda else torch.float32) for _ in range(2))
    seconds = []
    for _ in range(3 + reps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(seconds[3:])


def model_flops(config: dict, workload: dict) -> float:
    """Model FLOPs of one training step of `workload` (module docstring)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    layers = config["num_hidden_layers"] * (2 * h * h + 2 * h * kv + 3 * h * i)  # q, o; k, v; gate, up, down
    prompts, k, response = workload["prompts"], workload["k"], workload["response_len"]
    unique = prompts * (workload["prompt_len"] + k * response)
    return 6 * layers * unique + 6 * h * v * prompts * k * response


def mfu(report: dict, result: dict, device_name: str) -> dict:
    """POFE's step MFU against the measured matmul rate and, where known, the datasheet's."""
    seconds = result["seconds_median"]["pofe"]
    achieved = model_flops(report["model_config"], result["workload"]) / seconds
    out = {"model_flops_per_second": achieved, "mfu_vs_measured_matmul": achieved / report["matmul_flops"]}
    peak = next((f for name, f in DATASHEET_BF16_FLOPS.items() if name in device_name), None)
    if peak:
        out["mfu_vs_datasheet"] = achieved / peak
    return out


def checks(report: dict) -> list[dict]:
    from benchmarks.gpu_check.report import row
    from benchmarks.run import TARGETS

    rows = []
    for r in report["runs"]["full"]:
        name = r["workload"]["name"]
        ratios = []
        for key, value in r["ratios"].items():
            op, goal = TARGETS.get((name, key), ("", None))
            if value != value:  # NaN: a memory figure too small to measure
                ratios.append(f"{key} n/a")
                continue
            met = "" if goal is None else (" met" if (value >= goal if op == ">=" else value <= goal) else " MISSED")
            ratios.append(f"{key} {value:.2f}{f' ({op} {goal}{met})' if goal else ''}")
        rows.append(
            row(
                f"speed {name}",
                "measured",
                f"pofe {r['tokens_per_second']['pofe']:,.0f} tok/s ({r['auto_layout']}); " + ", ".join(ratios),
                ratios=r["ratios"],
                tokens_per_second=r["tokens_per_second"],
            )
        )
        m = mfu(report, r, report.get("gpu", "cpu"))
        rows.append(
            row(
                f"MFU {name}",
                "measured",
                f"{m['model_flops_per_second'] / 1e12:.3g} TFLOP/s of model FLOPs: "
                f"{m['mfu_vs_measured_matmul']:.1%} of the matmul rate measured here "
                f"({report['matmul_flops'] / 1e12:.3g} TFLOP/s)"
                + (f", {m['mfu_vs_datasheet']:.1%} of the datasheet's dense bf16" if "mfu_vs_datasheet" in m else ""),
                **m,
            )
        )
    return rows
