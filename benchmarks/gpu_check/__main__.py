"""`python -m benchmarks.gpu_check [--tiny] [--out JSON] [--work DIR] [--skip STAGE,...]`: see
`benchmarks/gpu_check/__init__.py` and benchmarks/README.md. Exits 1 when any row is FAIL."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

STAGES = ("generate", "train", "prefix", "speed", "judges")


def plan_rows(rows: list[dict], runs: dict, vllm: dict | None, max_tokens: int, cuda: bool) -> dict:
    """The plan of each run's recipe, with vLLM generation as the generate stage ran it; its
    memory rows appended to `rows`."""
    import torch

    from benchmarks.gpu_check import generate, plan

    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9 if cuda else 0.0
    plans = {
        name: plan.estimates(
            Path(r["recipe"]), generate.settings(max_tokens), generate.PROMPTS, gpu_gb, "cuda" if cuda else "cpu"
        )
        for name, r in runs.items()
    }
    if vllm is not None and "seen" in vllm:  # vLLM ran
        rows.append(
            plan.check(
                "generate (vLLM)",
                plans["sppo-kernels-off"]["generate"],
                vllm.get("device_used_gib"),
                cuda,
                allocator=False,
            )
        )
    for name, r in runs.items():
        rows.append(plan.check(f"train {name}", plans[name]["train"], r.get("peak_gpu_gib"), cuda, allocator=True))
    return plans


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the CPU path: tiny model, float32, 2 steps")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/gpu-check-*.json)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/pofe-gpu-check"), help="models, runs and logs")
    parser.add_argument("--skip", default="", help=f"comma list of stages not to run, of {', '.join(STAGES)}")
    args = parser.parse_args(argv)

    import torch

    from benchmarks.gpu_check import generate, judges, prefix, speed, train
    from benchmarks.gpu_check.model import bos_behaviour, build_model, build_tokenizer
    from benchmarks.gpu_check.report import row, table, write

    cuda = not args.tiny
    if cuda and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        sys.exit("benchmarks/gpu_check: needs a CUDA GPU with bf16 (--tiny runs the same path on the CPU)")
    skip = set(filter(None, args.skip.split(",")))
    if skip - set(STAGES):
        sys.exit(f"benchmarks/gpu_check: unknown stages {sorted(skip - set(STAGES))}; stages are {', '.join(STAGES)}")
    start, seconds = time.time(), {}
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model(
        args.work / ("model-tiny" if args.tiny else "model-1b"),
        tokenizer,
        "tiny" if args.tiny else "1b",
        "bfloat16" if cuda else "float32",
    )
    bos = bos_behaviour(tokenizer)
    rows = [
        row(
            "tokenizer writes and adds BOS",
            "pass" if bos["template_writes_bos"] and bos["tokenizer_adds_bos"] else "FAIL",
            f"{bos}",
        )
    ]
    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "tiny": args.tiny,
        "model": str(model),
        "tokenizer": bos,
        "torch": torch.__version__,
    }
    seconds["model"] = time.time() - start

    def timed(name, fn, *a):
        """Run stage `name` unless skipped; an exception is that stage's FAIL row, and the next
        stages still run (one lost stage must not cost the GPU's whole budget)."""
        if name in skip:
            return None
        t0 = time.time()
        try:
            return fn(*a)
        except Exception as err:  # noqa: BLE001 - reported as the stage's row, with its traceback in the JSON
            rows.append(
                row(f"stage {name}", "FAIL", f"{type(err).__name__}: {err}"[:300], traceback=traceback.format_exc())
            )
            return None
        finally:
            seconds[name] = time.time() - t0

    max_tokens = 128 if cuda else 8
    vllm = timed("generate", generate.run, args.work, model, tokenizer, max_tokens, cuda)
    if vllm is not None:
        rows += generate.checks(vllm, tokenizer.bos_token_id)
        report["generate"] = {k: v for k, v in vllm.items() if k not in ("seen", "samples", "text_seen", "sent")}
    runs = timed("train", train.run_all, args.work / "train", model, 2 if args.tiny else 20, cuda)
    if runs is not None:
        rows += train.checks(runs)
        report["train"] = runs
    rows += timed("prefix", prefix.checks, model, tokenizer, cuda) or []
    bench = timed("speed", speed.run, args.work, cuda)
    if bench is not None:
        rows += speed.checks(bench)
        report["speed"] = bench
    judged = timed("judges", judges.run, args.work / "judges", cuda)
    if judged is not None:
        rows += judges.checks(judged)
        report["judges"] = judged

    if runs is not None:
        report["plan"] = timed("plan", plan_rows, rows, runs, vllm, max_tokens, cuda)
    for stage in sorted(skip):
        rows.append(row(f"stage {stage}", "skipped: --skip"))

    report["rows"], report["seconds"] = rows, {**seconds, "total": time.time() - start}
    out = args.out or Path(__file__).parents[1] / "results" / f"gpu-check-{'tiny-cpu' if args.tiny else 'cuda'}.json"
    write(out, report)
    print(table(rows))
    print(f"\n{report['seconds']['total']:.0f} s; wrote {out}")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
