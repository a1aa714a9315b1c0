"""Peak GPU memory and disk of a stage, from a model's size: pure arithmetic (`axolotl pofe plan`).

Everything here takes numbers (a `ModelSize`, counted once from the model's config.json by
`pofe.run.plan.model_size`) and returns bytes; nothing imports torch but DeepSpeed's estimator. Units: bytes, shown in GB
(1e9 bytes), as GPU makers state a GPU's memory.

What each term assumes, so that a number can be checked against a run:
- Weights: bf16 = 2 bytes a parameter, fp32 = 4. QLoRA (bitsandbytes NF4, as axolotl loads
  it: blocks of 64, double quantisation) stores the decoder layers' linear weights at half a
  byte plus 1/64 byte (8-bit absmax) plus 4/(64*256) byte (the second level's fp32 constants);
  embeddings, norms and lm_head stay in bf16.
- Trainable state: LoRA keeps fp32 adapters with fp32 gradients and two Adam moments
  (16 bytes a parameter). Full fine-tuning without DeepSpeed trains in the weights' dtype
  (axolotl loads bf16 weights; torch's AdamW keeps its moments in the parameters' dtype).
  ZeRO-3: DeepSpeed's own estimator (`zero3_model_states`).
- Activations with gradient checkpointing: each layer's input (hidden x dtype bytes a token)
  is kept; one layer at a time is recomputed in backward, holding what its backward needs:
  about 9 hidden + 2 kv + 4 intermediate values a token (norm inputs and outputs, q/k/v,
  attention output, residuals, gate/up/act/product; SDPA keeps no attention matrix).
- Logits: POFE scores `logit_chunk_size` response tokens at a time in fp32 (`pofe.columns`).
- vLLM reserves `gpu_memory_utilization` of the GPU for itself (weights, activations, and
  the rest as KV cache); it starts only if weights plus one `max_model_len` sequence's KV
  cache fit in that share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
# bitsandbytes NF4 with double quantisation: 4 bits + the 8-bit absmax of each 64-weight
# block + one fp32 constant per 256 absmax values
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
LORA_STATE_BYTES = 16  # fp32 adapter weight, gradient, Adam m and v
# The CUDA context and kernels, taken by every process on a GPU before any tensor (0.3-0.6 GB
# on current drivers): the upper end.
CUDA_CONTEXT_BYTES = 0.5 * GB


@dataclass(frozen=True)
class ModelSize:
    """A model's parameter counts and shapes (`pofe.run.plan.model_size.model_size` counts them)."""

    total: int  # every parameter
    layer_linear: int  # the decoder layers' nn.Linear weights (what NF4 quantises)
    largest_layer: int  # the largest module's parameters (DeepSpeed gathers one at a time)
    lora_linears: tuple[tuple[str, int, int], ...]  # (module name, in, out) of each layer linear
    hidden: int
    layers: int
    intermediate: int
    kv_dim: int  # kv heads x head dim
    heads: int
    vocab: int
    max_position: int
    dtype: str  # the checkpoint's (config.json's torch_dtype / dtype)

    @property
    def other(self) -> int:
        """Embeddings, norms and lm_head: what NF4 leaves in 16 bits."""
        return self.total - self.layer_linear


def weights_bytes(size: ModelSize, dtype: str, quantization: str | None = None) -> float:
    """The weights of one copy: `quantization` None, "nf4" (QLoRA) or "int8" (LoRA 8-bit)."""
    half = DTYPE_BYTES[dtype]
    if quantization == "nf4":
        return size.layer_linear * NF4_BYTES + size.other * half
    if quantization == "int8":  # LLM.int8: a byte a weight plus an fp32 scale per row (ignored)
        return size.layer_linear * 1 + size.other * half
    return size.total * half


def lora_parameters(size: ModelSize, r: int, targets: list[str] | None) -> int:
    """LoRA's parameters: r x (in + out) for each targeted linear of the decoder layers.

    `targets` None: every linear (`lora_target_linear`); else module-name suffixes, as peft matches
    `target_modules`."""
    return sum(
        r * (fan_in + fan_out)
        for name, fan_in, fan_out in size.lora_linears
        if targets is None or name.rsplit(".", 1)[-1] in targets
    )


def full_state_bytes(total: int, dtype: str, optimizer: str) -> float:
    """Full fine-tuning without DeepSpeed: gradients and optimiser moments in the weights' dtype."""
    return total * DTYPE_BYTES[dtype] * (1 + optimizer_states(optimizer))


def optimizer_states(optimizer: str) -> float:
    """Moments per parameter, in units of the parameter's dtype (8-bit optimisers: a byte each)."""
    name = (optimizer or "adamw_torch").lower()
    if "sgd" in name:
        return 0
    if "8bit" in name:
        return 0.5
    return 2


def zero3_model_states(
    total: int, largest_layer: int, gpus: int, offload_optimizer: bool, offload_params: bool
) -> float:
    """Per-GPU bytes of ZeRO-3's model states: DeepSpeed's own estimator
    (`estimate_zero3_model_states_mem_needs`: 18 bytes a parameter over the GPUs, plus the
    largest layer gathered in fp32 width), one node."""
    import contextlib
    import sys

    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs to stdout, which holds `plan --json`
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    _, gpu, _ = estimate_zero3_model_states_mem_needs(
        total,
        largest_layer,
        num_gpus_per_node=gpus,
        num_nodes=1,
        cpu_offload=offload_optimizer,
        cpu_offload_params=offload_params,
        zero_init=True,
    )
    return float(gpu)


def layer_values_per_token(size: ModelSize) -> int:
    """What one decoder layer's backward keeps a token (the module docstring lists them)."""
    return 9 * size.hidden + 2 * size.kv_dim + 4 * size.intermediate


def activation_bytes(size: ModelSize, tokens: int, dtype: str, checkpointing: bool) -> float:
    """Training activations for `tokens` tokens a step, per GPU."""
    per_value = DTYPE_BYTES[dtype]
    layer = layer_values_per_token(size) * per_value * tokens
    if checkpointing:
        return size.layers * size.hidden * per_value * tokens + layer
    return size.layers * layer


def logit_chunk_bytes(size: ModelSize, chunk: int) -> float:
    """One chunk of fp32 logits over the vocabulary."""
    return chunk * size.vocab * 4


def kv_bytes_per_token(size: ModelSize, dtype: str) -> float:
    """K and V of every layer for one token."""
    return 2 * size.layers * size.kv_dim * DTYPE_BYTES[dtype]


def forward_bytes(size: ModelSize, tokens: int, dtype: str, attention_rows: int = 0) -> float:
    """Inference peak beyond the weights: one layer's values for `tokens` tokens, plus
    `attention_rows` x heads attention scores (eager attention; SDPA keeps none)."""
    per_value = DTYPE_BYTES[dtype]
    return layer_values_per_token(size) * per_value * tokens + attention_rows * size.heads * per_value


def steps_per_round(
    prompts: int | None, micro_batch: int, accumulation: int, data_parallel: int, epochs: float, max_steps: int | None
) -> int | None:
    """A round's optimizer steps as its trainer runs them. `max_steps` (> 0) when set: axolotl
    hands it to transformers, which runs as many epochs as reaching it takes, so it overrides
    num_epochs both ways. Else POFE's total_num_steps (`pofe.data.loader`), which axolotl hands
    over as max_steps: rows x epochs over the micro_batch x accumulation x data_parallel rows of a
    step. None: neither max_steps nor the prompts known."""
    if max_steps is not None and max_steps > 0:
        return max_steps
    if prompts is None:
        return None
    return math.ceil(prompts * epochs / (micro_batch * accumulation * data_parallel))


def steps_per_epoch(prompts: int, micro_batch: int, accumulation: int, data_parallel: int) -> int:
    """transformers' optimizer steps in one pass over the rows: each rank's batches of
    micro_batch, taken accumulation at a time (the last group shorter)."""
    return max(math.ceil(math.ceil(prompts / (micro_batch * data_parallel)) / accumulation), 1)


def save_interval(steps: int | None, save_steps: float) -> int | None:
    """transformers' save_steps in steps: under 1, that fraction of the round's steps, rounded
    up (`TrainerState.compute_steps`); None: a fraction of steps not known."""
    if save_steps >= 1:
        return int(save_steps)
    return None if steps is None else math.ceil(steps * save_steps)


def checkpoints_saved(steps: int | None, every: int | None, first_step: bool = False) -> int | None:
    """Checkpoints a round's trainer writes, one every `every` steps (save_steps, or an epoch's
    steps), as transformers' `DefaultFlowCallback` saves them: at each multiple of it, and at the
    last step when that is not one (strategy "steps" saves at the end; the last epoch, cut short
    by max_steps, ends there). `first_step` (axolotl's save_first_step): one more at step 1,
    unless one falls there anyway. None: the steps or the interval unknown."""
    if steps is None or every is None:
        return None
    return math.ceil(steps / every) + int(first_step and every > 1 and steps > 1)


def checkpoint_bytes(
    mode: str, trainable: int, dtype: str, optimizer: str, save_only_model: bool, gather_16bit: bool = True
) -> float:
    """One `checkpoint-<step>/`. `mode`: "lora" (the fp32 adapter; its Adam moments unless
    save_only_model), "full" (the model; its optimiser state unless save_only_model) or "zero3"
    (DeepSpeed's full state: bf16 parameter shards, fp32 master weights and two Adam moments,
    14 bytes a parameter, plus the gathered 16-bit model with
    `stage3_gather_16bit_weights_on_model_save`; save_only_model: the 16-bit model alone)."""
    if mode == "lora":
        return trainable * (4 + (0 if save_only_model else 4 * optimizer_states(optimizer)))
    if mode == "zero3":
        model = trainable * 2
        return model if save_only_model else trainable * 14 + (model if gather_16bit else 0)
    model = trainable * DTYPE_BYTES[dtype]
    return model * (1 + (0 if save_only_model else optimizer_states(optimizer)))
