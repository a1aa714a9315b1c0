"""What the stages of a plan share (`pofe.run.plan.planner`): the machine, the dtypes, the prompt counts, an entry."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pofe.args import PofeConfig
from pofe.run.plan import estimate as mem
from pofe.run.plan.estimate import GB
from pofe.run.prompts import held_out_count, resolve_round_prompts, split_prompts

# A process's resident set before any model on the CPU: Python with torch 2.13 (CPU),
# transformers and axolotl's trainer imported (measured: 0.77 GB).
CPU_PROCESS_BYTES = 0.8 * GB
VLLM_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization
MAX_SHARD_BYTES = 5 * GB  # transformers' default max_shard_size: the efficient merge holds one shard


@dataclass(frozen=True)
class PlanOptions:
    """The machine: `gpus` per node, each of `gpu_memory_gb`; `device` cpu plans a CPU run, None
    the device the recipe is for (`recipe_device`, in `pofe.run.plan.planner.plan_recipe`)."""

    gpus: int = 1
    gpu_memory_gb: float = 80.0
    device: str | None = "cuda"

    @property
    def runtime(self) -> float:
        return mem.CUDA_CONTEXT_BYTES if self.device == "cuda" else CPU_PROCESS_BYTES


def recipe_device(raw: dict) -> tuple[str, str]:
    """(device, why): "cpu" for a recipe that turns half precision off (`bf16: false`, no
    `fp16: true`), as a CPU recipe must (axolotl's default `bf16: auto` fails on a CPU), else
    "cuda"."""
    if raw.get("bf16") is False and raw.get("fp16") is not True:
        return "cpu", "the recipe sets bf16: false, as a CPU recipe does"
    return "cuda", "the recipe trains in half precision" if raw.get("bf16") or raw.get("fp16") else "a GPU by default"


def compute_dtype(raw: dict, device: str) -> str:
    """The training dtype axolotl uses: bf16 (true, or auto on a GPU), fp16, else fp32."""
    bf16 = raw.get("bf16")
    if bf16 is True or (str(bf16) == "auto" and device == "cuda"):
        return "bfloat16"
    return "float16" if raw.get("fp16") is True else "float32"


def deepspeed_config(raw: dict) -> dict:
    """The `deepspeed:` JSON's zero_optimization block ({} without DeepSpeed); a relative path
    counts from the directory axolotl runs in, as axolotl reads it."""
    path = raw.get("deepspeed")
    if not path:
        return {}
    if isinstance(path, dict):
        return path.get("zero_optimization") or {}
    file = Path(path)
    if not file.is_file():
        raise ValueError(
            f"deepspeed: {path!r} is not a file (relative paths count from the directory "
            "axolotl runs in: run from the repository root)"
        )
    return json.loads(file.read_text()).get("zero_optimization") or {}


def round_prompt_counts(pcfg: PofeConfig, prompts: int | None) -> list[int | None]:
    """Prompts each round trains on, as `prepare_prompts` splits them (held-out rows removed);
    with one dataset per round (`round_prompts` a list), `prompts` each."""
    if prompts is None or isinstance(pcfg.round_prompts, list):  # a list: one dataset per round
        return [prompts] * pcfg.rounds
    held = held_out_count(prompts, pcfg.eval.held_out, pcfg.eval.prompts is not None) if pcfg.eval else 0
    mode = resolve_round_prompts(pcfg.method, pcfg.round_prompts)
    return [len(r) for r in split_prompts(prompts - held, pcfg.rounds, mode)]


def candidates_per_prompt(pcfg: PofeConfig) -> int:
    return pcfg.generate.num_candidates + len(pcfg.generate.include_dataset_responses)


def trained_candidates(pcfg: PofeConfig) -> int:
    """Responses in each training row: SPPO's best_worst keeps two."""
    return 2 if pcfg.candidates.keep == "best_worst" else candidates_per_prompt(pcfg)


def gb(value: float | None) -> float | None:
    return None if value is None else round(value / GB, 2)


def stage(
    name: str,
    t: int | None,
    model: str,
    *,
    dtype: str,
    parts: dict[str, float],
    options: PlanOptions,
    device: str | None = None,
    quantization: str | None = None,
    gpus: int = 1,
    tp: int = 1,
    dp: int = 1,
    disk: float | None = 0.0,
    counts: dict | None = None,
    note: str = "",
) -> dict:
    """One entry of the plan; `parts` in bytes (per GPU), shown in GB, summed to gpu_memory_gb."""
    device = device or options.device
    total = None if any(v is None for v in parts.values()) else sum(parts.values())
    return {
        "stage": name,
        "round": t,
        "model": model,
        "dtype": dtype,
        "quantization": quantization,
        "device": device,
        "gpus": gpus if device == "cuda" else 0,
        "tensor_parallel": tp,
        "data_parallel": dp,
        "gpu_memory_gb": gb(total) if device == "cuda" else 0.0,
        "cpu_memory_gb": gb(total) if device == "cpu" else None,
        "parts_gb": {k: gb(v) for k, v in parts.items()},
        "disk_gb": gb(disk),
        "counts": counts or {},
        "note": note,
    }
