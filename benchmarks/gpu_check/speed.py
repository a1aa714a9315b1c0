"""The CPU benchmark's step-time ratios and tokens/s (`benchmarks.run`) on this machine: full
fine-tuning of TinyLlama's shape in bf16 with sdpa on CUDA, the tiny model in float32 on the CPU.
Rows report figures (`measured`), with `benchmarks.run.TARGETS` met or MISSED: a speed target
is not a correctness check."""

from __future__ import annotations

from pathlib import Path


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
    return json.loads(path.read_text())


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
    return rows
