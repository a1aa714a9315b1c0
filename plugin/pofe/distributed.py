"""Collectives over the training processes; each is the identity in a one-process run.

torch.distributed is read directly (not the trainer's `Accelerator`) so pure helpers and
stand-in trainers use them alike; accelerate, DeepSpeed and FSDP all initialise it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pofe.compat.distributed import disable_deepspeed_shm_op, load_rank_on_cpu, remake_state_on_cpu
from pofe.logs import get_logger

LOG = get_logger(__name__)


def rank_and_world() -> tuple[int, int]:
    """(this process's rank, number of processes); (0, 1) without torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def sum_over_ranks(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Elementwise sum of `tensor` over all processes, returned on `tensor`'s device.

    `device` is where the collective runs: NCCL reduces only CUDA tensors.
    """
    if rank_and_world()[1] == 1:
        return tensor
    total = tensor.to(device)
    dist.all_reduce(total)
    return total.to(tensor.device)


def all_ranks(flag: bool, device: torch.device | str) -> bool:
    """True when `flag` holds on every process (every process must call this)."""
    return bool(sum_over_ranks(torch.tensor([int(not flag)]), device).item() == 0)


def merge_rows(table: torch.Tensor, written: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Each process wrote its own rows of `table`; return the union, NaN where none wrote.

    `written` (bool, the shape of `table`) marks the entries this process filled. Every
    entry is written by at most one process, so the sum adds only zeros to it: the
    merged values equal the written ones bit for bit (NaN included).
    """
    if rank_and_world()[1] == 1:
        return table
    values = sum_over_ranks(torch.where(written, table, 0.0), device)
    counts = sum_over_ranks(written.to(table.dtype), device)
    return torch.where(counts > 0, values, float("nan"))


def deepspeed_on_cpu_ranks(deepspeed) -> bool:
    """A DeepSpeed run (`deepspeed`: its config, None otherwise) of several processes
    without accelerator: the state `place_ranks_on_cpu` makes for it must be kept."""
    return bool(deepspeed) and not torch.accelerator.is_available() and rank_and_world()[1] > 1


def skip_deepspeed_shm_build(cfg) -> None:
    """Without an accelerator, keep DeepSpeed from JIT-building its shared-memory comm op.

    DeepSpeed's CPU accelerator compiles that op when its comm starts (axolotl's `load_cfg`
    starts it for a `deepspeed:` recipe): minutes of C++ on a small machine, and a build
    killed halfway leaves a lock in torch's extension cache that hangs every later start.
    The op serves only `inference_all_reduce` (tensor-parallel inference), which falls back
    to torch.distributed's all-reduce; ZeRO's collectives never use it. Marked incompatible,
    DeepSpeed skips it (`deepspeed.comm.torch.build_shm_op`).
    """
    if not cfg.get("deepspeed") or torch.accelerator.is_available():
        return
    disable_deepspeed_shm_op()


def place_ranks_on_cpu(cfg) -> None:
    """Train with several processes on a machine without accelerator: models on the CPU, gloo.

    axolotl 0.19's `normalize_config` sets `device_map = {"": LOCAL_RANK}` whenever
    world_size > 1 (a recipe's `device_map` is overwritten), which transformers reads as
    accelerator LOCAL_RANK: every rank fails to load. The model loader holds this very
    dict in its `from_pretrained` arguments (`pre_model_load` runs after it copied them),
    so it is changed in place. And axolotl's early `PartialState()` is not told `cpu`, so
    accelerate reports no distributed run and the Trainer would train each rank alone:
    the state is made again with `cpu=True` (the gloo group already exists), and
    `ACCELERATE_USE_CPU` makes the TrainingArguments ask for it too. Under DeepSpeed
    (ZeRO-3 on CPU ranks) the state is made with the gloo backend instead, and the
    TrainingArguments and the Trainer keep it (`use_configured_state`; the trainer's
    `create_accelerator_and_postprocess`). Nothing happens where an accelerator exists or
    in a one-process run.
    """
    device_map = cfg.get("device_map")
    if (cfg.get("world_size") or 1) == 1 or torch.accelerator.is_available() or not isinstance(device_map, dict):
        return
    load_rank_on_cpu(device_map)
    state = remake_state_on_cpu(deepspeed=bool(cfg.get("deepspeed")))
    if cfg.get("deepspeed"):
        # the Trainer's Accelerator must keep this state: made anew it would count one process
        cfg.accelerator_config = {**(cfg.get("accelerator_config") or {}), "use_configured_state": True}
    LOG.info(
        f"POFE: no accelerator: rank {state.process_index} of {state.num_processes} trains on the CPU "
        f"({state.distributed_type.value}, {dist.get_backend()})"
    )
