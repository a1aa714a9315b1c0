"""accelerate's and DeepSpeed's process state and ZeRO-3's partitioned parameters."""

from __future__ import annotations

import os

from pofe.compat.registry import entry


@entry(
    reaches="accelerate: PartialState._reset_state(), and which branch of PartialState.__init__ counts the "
    "processes of a CPU run (`if not cpu` comes before ACCELERATE_USE_DEEPSPEED; without a known accelerator "
    "the backend must be named)",
    names=("_reset_state",),
    written_for="accelerate 1.13.0, 1.15.0",
    goes_when="axolotl makes its first PartialState with cpu=True where no accelerator exists, so that state "
    "counts the gloo processes and need not be made again",
)
def remake_state_on_cpu(deepspeed: bool):
    """accelerate's process state made again for CPU ranks (the gloo group already exists):
    for DeepSpeed with the gloo backend, else with `cpu=True` (and `ACCELERATE_USE_CPU`, which
    the TrainingArguments read). Returns the new `PartialState`."""
    from accelerate import PartialState

    PartialState._reset_state()
    if deepspeed:
        return PartialState(backend="gloo")
    os.environ["ACCELERATE_USE_CPU"] = "true"
    return PartialState(cpu=True)


@entry(
    reaches="axolotl: normalize_config sets device_map = {'': LOCAL_RANK} whenever world_size > 1, "
    "overwriting the recipe's, and its model loader keeps that very dict for from_pretrained",
    names=(),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl leaves device_map alone (or sets 'cpu') on a machine without accelerator",
)
def load_rank_on_cpu(device_map: dict) -> None:
    """Point axolotl's device map at the CPU, in place (from `pre_model_load`, when the loader holds it)."""
    device_map[""] = "cpu"


@entry(
    reaches="DeepSpeed: deepspeed.ops.__compatible_ops__, read by deepspeed.comm.torch.build_shm_op",
    names=("__compatible_ops__",),
    written_for="DeepSpeed 0.18.9 (both legs)",
    goes_when="DeepSpeed's CPU accelerator stops building the shm op when its comm starts (or offers a switch)",
)
def disable_deepspeed_shm_op() -> None:
    """Mark DeepSpeed's shared-memory comm op incompatible: its CPU accelerator then skips building it."""
    from deepspeed.ops import __compatible_ops__ as compatible_ops  # noqa: N811 (DeepSpeed's name)

    compatible_ops["deepspeed_shm_comm"] = False


@entry(
    reaches="DeepSpeed: the ds_id attribute ZeRO-3 gives each partitioned parameter",
    names=("ds_id",),
    written_for="DeepSpeed 0.18.9 (both legs)",
    goes_when="accelerate or DeepSpeed offers a public test for a ZeRO-3-partitioned parameter",
)
def is_zero3_partitioned(param) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions `param` (and gathers it at each use)."""
    return hasattr(param, "ds_id")
