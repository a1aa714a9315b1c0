"""`python -m benchmarks.gpu_check [--tiny] [--out JSON] [--work DIR] [--stages S,...] [--skip S,...]`:
see `benchmarks/gpu_check/__init__.py` and benchmarks/README.md. Exits 1 when any row is FAIL."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

STAGES = ("train", "online", "generate", "vllm", "prefix", "speed", "judges")  # the trainers' numbers first
VERSIONS = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "axolotl",
    "trl",
    "datasets",
    "bitsandbytes",
    "triton",
    "huggingface_hub",
    "pofe",
)


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def get(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {name: get(name) for name in VERSIONS}


def plan_rows(rows: list[dict], work: Path, model: Path, runs: dict, gen: dict, max_tokens: int, cuda: bool) -> dict:
    """The plan of each training run's recipe and of each generation that ran (`gen`: backend ->
    its result); their memory rows appended to `rows`."""
    import torch

    from benchmarks.gpu_check import generate, plan, train

    gpu_gb = torch.cuda.get_device_properties(0).total_memory / 1e9 if cuda else 0.0
    device = "cuda" if cuda else "cpu"
    out = {}
    for name, r in runs.items():
        settings = generate.settings(max_tokens, "transformers")  # the train entry does not depend on it
        out[name] = plan.estimates(Path(r["recipe"]), settings, generate.PROMPTS, gpu_gb, device)
        rows.append(plan.check(f"train {name}", out[name]["train"], r.get("peak_gpu_gib"), cuda, allocator=True))
    recipe = train.recipe(work / "plan", model, "sppo", "full", False, 2, cuda)  # generation sizes its model
    for backend, res in gen.items():
        if not res or "seen" not in res:  # skipped or failed: its own row says so
            continue
        settings = generate.settings(max_tokens, backend, res.get("max_prompt_tokens"))
        estimate = plan.estimates(recipe, settings, generate.PROMPTS, gpu_gb, device)["generate"]
        out[f"generate {backend}"] = estimate
        measured = res.get("peak_gpu_gib") if backend == "transformers" else res.get("device_used_gib")
        rows.append(plan.check(f"generate ({backend})", estimate, measured, cuda, allocator=backend == "transformers"))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the CPU path: tiny model, float32, 2 steps")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default benchmarks/results/gpu-check-*.json)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/pofe-gpu-check"), help="models, runs and logs")
    parser.add_argument(
        "--stages", default=",".join(STAGES), help=f"comma list of stages to run, of {', '.join(STAGES)}"
    )
    parser.add_argument("--skip", default="", help="comma list of stages not to run")
    args = parser.parse_args(argv)

    import torch

    from benchmarks.gpu_check import generate, judges, nash_md, online, prefix, speed, train
    from benchmarks.gpu_check.model import bos_behaviour, build_model, build_tokenizer
    from benchmarks.gpu_check.report import row, table, write

    cuda = not args.tiny
    if cuda and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        sys.exit("benchmarks/gpu_check: needs a CUDA GPU with bf16 (--tiny runs the same path on the CPU)")
    chosen, skip = (set(filter(None, a.split(","))) for a in (args.stages, args.skip))
    if (chosen | skip) - set(STAGES):
        sys.exit(f"benchmarks/gpu_check: unknown stages {sorted((chosen | skip) - set(STAGES))}; stages are {STAGES}")
    skip |= set(STAGES) - chosen
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
        "stages": [s for s in STAGES if s not in skip],
        "model": str(model),
        "tokenizer": bos,
        "versions": versions(),
        "python": sys.version.split()[0],
    }
    seconds["model"] = time.time() - start
    out = args.out or Path(__file__).parents[1] / "results" / f"gpu-check-{'tiny-cpu' if args.tiny else 'cuda'}.json"

    def timed(name, fn, *a):
        """Run stage `name` unless skipped; an exception is that stage's FAIL row, and the next
        stages still run (one lost stage must not cost the GPU's whole budget). The JSON so far is
        written before each stage: a command stopped at its limit still brings back the stages done."""
        if name in skip:
            return None
        write(out, {**report, "rows": rows, "seconds": seconds})
        t0 = time.time()
        try:
            return fn(*a)
        except Exception as err:  # noqa: BLE001 - reported as the stage's row, with its traceback in the JSON
            rows.append(
                row(f"stage {name}", "FAIL", f"{type(err).__name__}: {err}"[:300], traceback=traceback.format_exc())
            )
            return None
        finally:
            seconds[name] = seconds.get(name, 0.0) + time.time() - t0

    max_tokens = 128 if cuda else 8
    runs = timed("train", train.run_all, args.work / "train", model, 2 if args.tiny else 20, cuda)
    if runs is not None:
        rows += train.checks(runs)
        report["train"] = runs
    online_run = timed("online", online.run, args.work / "online", model, cuda)
    if online_run is not None:
        rows += online.checks(online_run)
        report["online"] = online_run
    nash_md_run = timed("online", nash_md.run, args.work / "nash-md", model, cuda)  # the online stage's second run
    if nash_md_run is not None:
        rows += nash_md.checks(nash_md_run)
        report["online_nash_md"] = nash_md_run
    hf = timed("generate", generate.run_transformers, model, tokenizer, max_tokens, cuda)
    if hf is not None:
        rows += generate.transformers_checks(hf, tokenizer.bos_token_id)
        report["generate"] = {k: v for k, v in hf.items() if k not in ("seen", "samples", "sent")}
    vllm = timed("vllm", generate.run_vllm, args.work, model, tokenizer, max_tokens, cuda)
    if vllm is not None:
        rows += generate.vllm_checks(vllm, tokenizer.bos_token_id)
        report["vllm"] = {k: v for k, v in vllm.items() if k not in ("seen", "samples", "text_seen", "sent")}
    rows += timed("prefix", prefix.checks, model, tokenizer, cuda) or []
    bench = timed("speed", speed.run, args.work, cuda)
    if bench is not None:
        rows += speed.checks(bench)
        report["speed"] = bench
    judged = timed("judges", judges.run, args.work / "judges", cuda)
    if judged is not None:
        rows += judges.checks(judged)
        report["judges"] = judged

    gen = {"transformers": hf, "vllm": vllm}
    report["plan"] = timed("plan", plan_rows, rows, args.work, model, runs or {}, gen, max_tokens, cuda)
    for stage in (s for s in STAGES if s in skip):
        rows.append(row(f"stage {stage}", "skipped: not asked for"))

    report["rows"], report["seconds"] = rows, {**seconds, "total": time.time() - start}
    write(out, report)
    print(table(rows))
    print(f"\n{report['seconds']['total']:.0f} s; wrote {out}")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
