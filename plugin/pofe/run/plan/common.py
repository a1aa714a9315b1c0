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
    the device the recipe is for (`recipe_device`, in `pofe.run.plan.planner.plan_recipe`).
    `gpus_from`: where the GPUs' number and memory come from, said with the plan (`machine_gpus`)."""

    gpus: int = 1
    gpu_memory_gb: float = 80.0
    device: str | None = "cuda"
    gpus_from: str = "--gpus, --gpu-memory"

    @property
    def runtime(self) -> float:
        return mem.CUDA_CONTEXT_BYTES if self.device == "cuda" else CPU_PROCESS_BYTES


def machine_gpus(gpus: int | None, gpu_memory_gb: float | None) -> tuple[int, float, str]:
    """(GPUs, GB each, where they come from): the options given, else this machine's GPUs (the
    first one's memory), else 1 x 80 GB, assumed: a plan made where the run will not be."""
    if gpus is not None and gpu_memory_gb is not None:
        return gpus, gpu_memory_gb, "--gpus, --gpu-memory"
    import torch

    if torch.cuda.is_available():
        memory = round(torch.cuda.get_device_properties(0).total_memory / GB, 1)
        return gpus or torch.cuda.device_count(), gpu_memory_gb or memory, "this machine's GPUs"
    return gpus or 1, gpu_memory_gb or 80.0, "assumed: this machine has no GPU; --gpus and --gpu-memory say yours"


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


def trained_prompts(pcfg: PofeConfig, prompts: int) -> int:
    """The prompts `axolotl train` trains on: the dataset's rows less `pofe.eval.held_out`'s
    (`pofe.data.held_out`: none when unset, where an iterated run holds out a default slice)."""
    return prompts - ((pcfg.eval.held_out or 0) if pcfg.eval else 0)


def round_candidates(
    pcfg: PofeConfig, prompts: int | None, responses: list[int] | None, command: str = "run"
) -> tuple[list[list[int] | None], bool]:
    """(each round's candidates per prompt, whether the dataset responses among them are
    estimated). A prompt's candidates: `num_candidates` sampled plus its row's dataset responses;
    a round's prompts: as `prepare_prompts` splits them (held-out rows removed); None when the
    prompts are not counted. `responses`: each dataset row's dataset responses
    (`pofe.run.plan.sources.prompt_rows`, one a row). Estimated, one per
    include_dataset_responses column and prompt, when they are not counted (None, another number
    of rows) or are not the rounds' rows (`round_prompts` a list: one dataset per round).
    `command` "train": the one training of `axolotl train` (`trained_prompts`), not a run's rounds."""
    columns = len(pcfg.generate.include_dataset_responses)
    if prompts is None:
        return [None] * (1 if command == "train" else pcfg.rounds), columns > 0
    files = isinstance(pcfg.round_prompts, list) and command == "run"
    counted = responses is not None and len(responses) == prompts and not files
    per_row = [pcfg.generate.num_candidates + n for n in (responses if counted else [columns] * prompts)]
    estimated = columns > 0 and not counted
    if command == "train":
        return [per_row[: trained_prompts(pcfg, prompts)]], estimated
    if files:
        return [per_row] * pcfg.rounds, estimated
    held = held_out_count(prompts, pcfg.eval.held_out, pcfg.eval.prompts is not None) if pcfg.eval else 0
    mode = resolve_round_prompts(pcfg.method, pcfg.round_prompts)
    return [per_row[r.start : r.stop] for r in split_prompts(prompts - held, pcfg.rounds, mode)], estimated


def candidates_per_prompt(pcfg: PofeConfig, per_prompt: list[int] | None = None) -> int:
    """The most candidates a prompt of the round has (`round_candidates`); without the
    prompts, num_candidates plus one response per include_dataset_responses column."""
    if per_prompt:
        return max(per_prompt)
    return pcfg.generate.num_candidates + len(pcfg.generate.include_dataset_responses)


def trained_candidates(pcfg: PofeConfig, per_prompt: list[int] | None = None) -> int:
    """Responses in a training row, at most: SPPO's best_worst keeps two."""
    return 2 if pcfg.candidates.keep == "best_worst" else candidates_per_prompt(pcfg, per_prompt)


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
