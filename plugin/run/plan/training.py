"""The train and merge stages of a plan (`pofe.run.plan.planner`): memory per GPU and the disk the
round's checkpoints, model and merged model take."""

from __future__ import annotations

from pofe.args import PofeConfig
from pofe.run.plan import estimate as mem
from pofe.run.plan.common import (
    MAX_SHARD_BYTES,
    PlanOptions,
    compute_dtype,
    deepspeed_config,
    stage,
    trained_candidates,
)
from pofe.run.plan.estimate import ModelSize

TRAIN_PARTS = ("weights", "trainable_state", "activations", "logits", "runtime")


def quantization(raw: dict) -> str | None:
    return "nf4" if raw.get("load_in_4bit") else "int8" if raw.get("load_in_8bit") else None


def lora_count(raw: dict, size: ModelSize) -> int:
    targets = None if raw.get("lora_target_linear") else list(raw.get("lora_target_modules") or [])
    return mem.lora_parameters(size, int(raw.get("lora_r", 8)), targets)


def _offloaded(zero: dict, key: str) -> bool:
    return str((zero.get(key) or {}).get("device", "none")).lower() == "cpu"


def train_memory(raw: dict, pcfg: PofeConfig, size: ModelSize, options: PlanOptions) -> dict[str, float]:
    """Per-GPU bytes of the training stage, by part (`pofe.run.plan.estimate` says what each assumes)."""
    dtype, zero = compute_dtype(raw, options.device), deepspeed_config(raw)
    tokens = int(raw.get("micro_batch_size", 1)) * trained_candidates(pcfg) * int(raw.get("sequence_len", 2048))
    parts: dict[str, float] = {}
    if raw.get("adapter"):
        parts["weights"] = mem.weights_bytes(size, dtype, quantization(raw))
        parts["trainable_state"] = lora_count(raw, size) * mem.LORA_STATE_BYTES
    elif zero.get("stage") == 3:
        parts["zero3_model_states"] = mem.zero3_model_states(
            size.total,
            size.largest_layer,
            options.gpus,
            _offloaded(zero, "offload_optimizer"),
            _offloaded(zero, "offload_param"),
        )
    else:
        parts["weights"] = mem.weights_bytes(size, dtype)
        parts["trainable_state"] = mem.full_state_bytes(size.total, dtype, str(raw.get("optimizer", "")))
    parts["activations"] = mem.activation_bytes(size, tokens, dtype, bool(raw.get("gradient_checkpointing")))
    parts["logits"] = mem.logit_chunk_bytes(size, pcfg.logit_chunk_size)
    parts["runtime"] = options.runtime
    return parts


def save_points(raw: dict, steps: int | None) -> tuple[int | None, int | None]:
    """(save interval in steps, checkpoints kept at the round's end); save_strategy no: 0 kept
    (the run's one forced save is removed after its trainer_state.json is copied)."""
    strategy = str(raw.get("save_strategy", "steps")).lower()
    if strategy in ("no", "false"):
        return None, 0
    limit = raw.get("save_total_limit")
    every = raw.get("save_steps")
    if strategy == "epoch" or raw.get("saves_per_epoch"):
        per_epoch = int(raw.get("saves_per_epoch") or 1)
        saves = per_epoch * int(float(raw.get("num_epochs", 1)) + 0.999)
        return None, saves if limit is None else min(saves, int(limit))
    return every, mem.checkpoints_kept(steps, int(every) if every else None, None if limit is None else int(limit))


def train_disk(raw: dict, size: ModelSize, steps: int | None, options: PlanOptions) -> tuple[float | None, dict]:
    """(bytes of round-<t>/train at the round's end, what they are). None: unknown checkpoints."""
    dtype, zero = compute_dtype(raw, options.device), deepspeed_config(raw)
    only_model = bool(raw.get("save_only_model"))
    if raw.get("adapter"):
        mode, trainable, final = "lora", lora_count(raw, size), lora_count(raw, size) * 4
    else:
        mode = "zero3" if zero.get("stage") == 3 else "full"
        trainable, final = size.total, size.total * mem.DTYPE_BYTES[dtype]
    each = mem.checkpoint_bytes(
        mode,
        trainable,
        dtype,
        str(raw.get("optimizer", "")),
        only_model,
        bool(zero.get("stage3_gather_16bit_weights_on_model_save", True)),
    )
    every, kept = save_points(raw, steps)
    info = {
        "checkpoint_gb": round(each / mem.GB, 2),
        "checkpoints_kept": kept,
        "save_steps": every,
        "model_gb": round(final / mem.GB, 2),
    }
    return (None if kept is None else kept * each + final), info


def train_stage(
    raw: dict, pcfg: PofeConfig, size: ModelSize | None, t: int, model: str, prompts: int | None, options: PlanOptions
) -> tuple[dict, list[str]]:
    """Training (and SPPO's anchor table, computed by the same model before the first step)."""
    dp, warnings = options.gpus if options.device == "cuda" else 1, []
    steps = (
        None
        if prompts is None
        else mem.steps_per_round(
            prompts,
            int(raw.get("micro_batch_size", 1)),
            int(raw.get("gradient_accumulation_steps", 1)),
            dp,
            float(raw.get("num_epochs", 1)),
        )
    )
    counts = {"rows": prompts, "responses_per_row": trained_candidates(pcfg), "steps": steps}
    if size is None:
        parts, disk = dict.fromkeys(TRAIN_PARTS), None
    else:
        parts = train_memory(raw, pcfg, size, options)
        disk, info = train_disk(raw, size, steps, options)
        counts.update(info)
        if disk is None:
            warnings.append(
                f"round {t} train: {info['checkpoint_gb']} GB a checkpoint, one every {info['save_steps']} steps, and "
                "neither the step count (the prompts could not be counted: pass --prompts) nor save_total_limit "
                "bounds them: set save_total_limit"
            )
    zero = deepspeed_config(raw)
    how = "ZeRO-3 shards" if zero.get("stage") == 3 else "a copy per GPU" if dp > 1 else ""
    return stage(
        "train",
        t,
        model,
        dtype=compute_dtype(raw, options.device),
        quantization=quantization(raw),
        parts=parts,
        options=options,
        gpus=dp,
        dp=dp,
        disk=disk,
        counts=counts,
        note=how,
    ), warnings


def merge_stage(raw: dict, size: ModelSize | None, t: int, model: str, options: PlanOptions) -> dict:
    """`axolotl merge-lora`: memory_efficient adds the delta shard by shard (one shard on the
    GPU), legacy loads the whole model; round-<t>/merged is the next policy, in the base's dtype."""
    dtype = size.dtype if size is not None else "bfloat16"
    if size is None:
        return stage(
            "merge", t, model, dtype=dtype, parts=dict.fromkeys(("weights", "runtime")), options=options, disk=None
        )
    whole = mem.weights_bytes(size, dtype)
    legacy = str(raw.get("merge_method", "memory_efficient")) == "legacy"
    parts = {"weights": whole if legacy else min(whole, MAX_SHARD_BYTES), "runtime": options.runtime}
    note = "the whole model" if legacy else "shard by shard (merge_method: memory_efficient)"
    return stage("merge", t, model, dtype=dtype, parts=parts, options=options, disk=whole, note=note)


def pi_0_stage(raw: dict, pcfg: PofeConfig, size: ModelSize | None, t: int, model: str, options: PlanOptions) -> dict:
    """`pofe.anchor_mix` in rounds 2..T: pi_0 (the run's base model) loaded on its own in the
    round's preprocess stage, after the judge, to score the round's candidates without gradients
    (`pofe.anchor.pi_0`): its weights as the policy loads them, one decoder layer's values for
    an eval batch of rows (no graph is kept), one chunk of logits."""
    dtype = compute_dtype(raw, options.device)
    note = "pofe.anchor_mix: pi_0's log-probs of the round's candidates, in its preprocess stage"
    names = ("weights", "activations", "logits", "runtime")
    if size is None:
        return stage("pi_0", t, model, dtype=dtype, parts=dict.fromkeys(names), options=options, note=note)
    rows = int(raw.get("eval_batch_size") or raw.get("micro_batch_size", 1))
    tokens = rows * trained_candidates(pcfg) * int(raw.get("sequence_len", 2048))
    parts = {
        "weights": mem.weights_bytes(size, dtype, quantization(raw)),
        "activations": mem.layer_values_per_token(size) * mem.DTYPE_BYTES[dtype] * tokens,
        "logits": mem.logit_chunk_bytes(size, pcfg.logit_chunk_size),
        "runtime": options.runtime,
    }
    return stage(
        "pi_0", t, model, dtype=dtype, quantization=quantization(raw), parts=parts, options=options, note=note
    )
