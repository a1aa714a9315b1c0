"""Each stage's measured peak beside `axolotl pofe plan`'s estimate for it.

The plan is `pofe.run.plan.planner.plan_run` on the check's own QLoRA recipe, given a generate section
(vLLM, K = 5, the check's `gpu_memory_utilization` and `max_model_len`) and a judge that loads
nothing, for the check's 64 prompts on this GPU. A stage passes when its measured peak is within
a factor 1.5 of the estimate (the factor tests/run/plan/test_plan.py holds the CPU recipes to). Measured:
training, axolotl's `memory/max_allocated (GiB)` (the torch allocator's peak), against the
estimate less its `runtime` part (the CUDA context, which the allocator does not count);
generation, the device memory in use while vLLM ran (it reserves its `gpu_memory_utilization`
share at start, context included), against the whole estimate.
"""

from __future__ import annotations

from pathlib import Path

import yaml

FACTOR = 1.5
GIB = 2**30


def estimates(train_recipe: Path, generate: dict, prompts: int, gpu_memory_gb: float, device: str) -> dict:
    """The plan's generate and train entries of round 1 for `train_recipe` with `generate` added."""
    from pofe.run.plan.common import PlanOptions
    from pofe.run.plan.planner import plan_run
    from pofe.run.plan.sources import model_sizes
    from pofe.run.recipe import translated_recipe

    raw = yaml.safe_load(train_recipe.read_text())
    raw["pofe"] = {
        **raw["pofe"],
        "generate": generate,
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    }
    raw, pcfg = translated_recipe(raw)
    sizes, _ = model_sizes(raw, pcfg)
    plan = plan_run(raw, pcfg, sizes, prompts, PlanOptions(gpus=1, gpu_memory_gb=gpu_memory_gb, device=device))
    return {s["stage"]: s for s in plan["stages"] if s["round"] == 1 and s["stage"] in ("generate", "train")}


def check(name: str, stage: dict, measured_gib: float | None, cuda: bool, allocator: bool) -> dict:
    """`allocator`: the measured figure is torch's allocator peak, which leaves out the context."""
    from benchmarks.gpu_check.report import row

    key = "gpu_memory_gb" if cuda else "cpu_memory_gb"
    estimate = stage.get(key)
    if estimate and allocator and cuda:
        key += " less runtime"
        estimate = round(estimate - (stage["parts_gb"].get("runtime") or 0.0), 2)
    values = {"estimate_gb": estimate, "measured_gb": None if measured_gib is None else measured_gib * GIB / 1e9}
    where = f"plan estimates {estimate} GB ({key})"
    if not cuda:
        return row(f"memory {name}", "needs GPU", f"{where}; the GPU peak needs CUDA", **values)
    if measured_gib is None or not estimate:
        return row(f"memory {name}", "FAIL", f"{where}; no peak measured", **values)
    ratio = values["measured_gb"] / estimate
    ok = 1 / FACTOR <= ratio <= FACTOR
    return row(
        f"memory {name}",
        "pass" if ok else "FAIL",
        f"measured {values['measured_gb']:.2f} GB, {where}: x{ratio:.2f} (within {FACTOR}x)",
        ratio=ratio,
        **values,
    )
