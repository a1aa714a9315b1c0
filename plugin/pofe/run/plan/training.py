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
# axolotl's trainer builder sets save_total_limit 4 when the recipe sets none (or 0)
AXOLOTL_SAVE_TOTAL_LIMIT = 4
TRANSFORMERS_SAVE_STEPS = 500  # TrainingArguments.save_steps, for `save_strategy: steps` alone


def quantization(raw: dict) -> str | None:
    return "nf4" if raw.get("load_in_4bit") else "int8" if raw.get("load_in_8bit") else None


def lora_count(raw: dict, size: ModelSize) -> int:
    targets = None if raw.get("lora_target_linear") else list(raw.get("lora_target_modules") or [])
    return mem.lora_parameters(size, int(raw.get("lora_r", 8)), targets)


def _offloaded(zero: dict, key: str) -> bool:
    return str((zero.get(key) or {}).get("device", "none")).lower() == "cpu"


def train_memory(
    raw: dict, pcfg: PofeConfig, size: ModelSize, responses: int, options: PlanOptions
) -> dict[str, float]:
    """Per-GPU bytes of the training stage, by part (`pofe.run.plan.estimate` says what each
    assumes), for rows of `responses` responses."""
    dtype, zero = compute_dtype(raw, options.device), deepspeed_config(raw)
    tokens = int(raw.get("micro_batch_size", 1)) * responses * int(raw.get("sequence_len", 2048))
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


def save_schedule(raw: dict) -> tuple[str, float | None]:
    """(save_strategy, save_steps) as axolotl hands them to transformers (`normalize_config`,
    then the trainer builder): save_steps sets "steps"; saves_per_epoch sets save_steps to
    1 / (saves_per_epoch x num_epochs), a fraction of the round's steps, when that is under 1;
    else save_strategy, "epoch" when unset. `no` (or YAML's false) is POFE's: one forced save at
    the end, removed once its trainer_state.json is copied (`pofe.run.rounds.round_recipe`)."""
    value = raw.get("save_strategy")
    strategy = "" if value is None else str(value).lower()
    if strategy in ("no", "false"):
        return "no", None
    every = raw.get("save_steps")
    if not every and raw.get("saves_per_epoch"):
        fraction = 1 / (int(raw["saves_per_epoch"]) * float(raw.get("num_epochs", 1)))
        every = fraction if fraction < 1 else None
    if every:
        return "steps", float(every)
    return strategy or "epoch", TRANSFORMERS_SAVE_STEPS if strategy == "steps" else None


def save_points(raw: dict, steps: int | None, epoch_steps: int | None) -> dict:
    """The round's checkpoints: its save schedule (`save_schedule`; with save_strategy epoch,
    an epoch's steps apart), how many the trainer writes (`pofe.run.plan.estimate.checkpoints_saved`;
    None when unknown) and how many are on disk at its end: at most save_total_limit (axolotl's 4
    when unset), as transformers deletes the oldest; with save_strategy no, none."""
    strategy, save_steps = save_schedule(raw)
    if strategy == "no":
        return {"save_strategy": "no", "steps_between_saves": None, "checkpoints_saved": None, "checkpoints_kept": 0}
    every = (
        epoch_steps if strategy == "epoch" else None if save_steps is None else mem.save_interval(steps, save_steps)
    )
    saved = mem.checkpoints_saved(steps, every, bool(raw.get("save_first_step")))
    limit = int(raw.get("save_total_limit") or AXOLOTL_SAVE_TOTAL_LIMIT)
    return {
        "save_strategy": strategy,
        "steps_between_saves": every,
        "checkpoints_saved": saved,
        "checkpoints_kept": limit if saved is None else min(saved, limit),
    }


def train_disk(raw: dict, size: ModelSize, kept: int, options: PlanOptions) -> tuple[float, dict]:
    """(bytes of round-<t>/train at the round's end, what they are): `kept` checkpoints
    (`save_points`) and the model."""
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
    return kept * each + final, {"checkpoint_gb": round(each / mem.GB, 2), "model_gb": round(final / mem.GB, 2)}


def train_stage(
    raw: dict,
    pcfg: PofeConfig,
    size: ModelSize | None,
    t: int | None,
    model: str,
    per_prompt: list[int] | None,
    options: PlanOptions,
    beside: dict[str, float | None] | None = None,
    note: str = "",
) -> dict:
    """Training (and SPPO's anchor table, computed by the same model before the first step);
    `per_prompt`: the round's candidates per prompt (`pofe.run.plan.common.round_candidates`).
    `beside`: parts (bytes per GPU) that share the training process's GPU, added to its own
    (an online run's generator, judge and pi_0: `pofe.run.plan.online`), said in `note`."""
    dp = options.gpus if options.device == "cuda" else 1
    batch = (int(raw.get("micro_batch_size", 1)), int(raw.get("gradient_accumulation_steps", 1)), dp)
    rows = None if per_prompt is None else len(per_prompt)
    max_steps = raw.get("max_steps")
    steps = mem.steps_per_round(
        rows, *batch, float(raw.get("num_epochs", 1)), None if max_steps is None else int(max_steps)
    )
    epoch_steps = None if rows is None else mem.steps_per_epoch(rows, *batch)
    responses = trained_candidates(pcfg, per_prompt)
    counts = {"rows": rows, "responses_per_row": responses, "steps": steps, **save_points(raw, steps, epoch_steps)}
    if size is None:
        parts, disk = dict.fromkeys(TRAIN_PARTS), None
    else:
        parts = train_memory(raw, pcfg, size, responses, options)
        disk, info = train_disk(raw, size, counts["checkpoints_kept"], options)
        counts.update(info)
    parts |= beside or {}
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
        note="; ".join(filter(None, (how, note))),
    )


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


def pi_0_stage(
    raw: dict,
    pcfg: PofeConfig,
    size: ModelSize | None,
    t: int,
    model: str,
    per_prompt: list[int] | None,
    options: PlanOptions,
) -> dict:
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
    tokens = rows * trained_candidates(pcfg, per_prompt) * int(raw.get("sequence_len", 2048))
    parts = {
        "weights": mem.weights_bytes(size, dtype, quantization(raw)),
        "activations": mem.layer_values_per_token(size) * mem.DTYPE_BYTES[dtype] * tokens,
        "logits": mem.logit_chunk_bytes(size, pcfg.logit_chunk_size),
        "runtime": options.runtime,
    }
    return stage(
        "pi_0", t, model, dtype=dtype, quantization=quantization(raw), parts=parts, options=options, note=note
    )
