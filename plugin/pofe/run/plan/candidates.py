"""The generate and judge stages of a plan (`pofe.run.plan.planner`): one function per stage,
each a `stage(...)` entry.

`size` is the stage's model (`pofe.run.plan.estimate.ModelSize`), None when it could not be
sized offline: the entry then has no memory figure (its parts are None). `per_prompt` is the
round's candidates per prompt (`pofe.run.plan.common.round_candidates`), None when the prompts are
not counted.
"""

from __future__ import annotations

import shlex
from collections import Counter

from pofe.args import PofeConfig
from pofe.run.plan import estimate as mem
from pofe.run.plan.common import VLLM_UTILIZATION, PlanOptions, stage
from pofe.run.plan.estimate import ModelSize


def _unknown(names: tuple[str, ...]) -> dict:
    return dict.fromkeys(names)


def worker_gpu_ids(pcfg: PofeConfig, options: PlanOptions, group: int = 1) -> list[str] | None:
    """Every GPU id a candidate worker holds (once per worker holding it), each worker with
    `group` GPUs (tensor parallel), as the pipeline assigns them (`pofe_candidates.parallel.
    assign_devices`) on --gpus visible GPUs; None when it cannot (`device_warnings` says why)."""
    from pofe_candidates.parallel import assign_devices

    visible = [str(i) for i in range(options.gpus)]
    try:
        devices = assign_devices(pcfg.candidates.num_workers, pcfg.candidates.worker_devices, group, visible)
    except ValueError:
        return None
    return [d.strip() for entry in devices for d in str(entry).split(",")]


def workers_per_gpu(pcfg: PofeConfig, options: PlanOptions, group: int = 1) -> int:
    """The most candidate workers sharing one GPU (`worker_gpu_ids`)."""
    ids = worker_gpu_ids(pcfg, options, group)
    return max(Counter(ids).values()) if ids else 1


def worker_gpus(pcfg: PofeConfig, options: PlanOptions, group: int = 1) -> int:
    """How many GPUs the candidate workers use (`worker_gpu_ids`)."""
    ids = worker_gpu_ids(pcfg, options, group)
    return len(set(ids)) if ids else pcfg.candidates.num_workers * group


def device_warnings(pcfg: PofeConfig, options: PlanOptions) -> list[str]:
    """The candidate workers' GPUs where --gpus cannot hold them: a `worker_devices` list naming a
    GPU the machine has not (the recipe's list is kept, not re-spread: it may name GPUs on
    purpose), or engines of several GPUs each that the GPUs cannot hold."""
    from pofe_candidates.parallel import assign_devices, engine_group_size

    if options.device != "cuda" or pcfg.generate is None or pcfg.online is not None:
        return []
    group, c = engine_group_size(pcfg.generate), pcfg.candidates
    try:
        assign_devices(c.num_workers, c.worker_devices, group, [str(i) for i in range(options.gpus)])
    except ValueError as e:
        return [f"pofe.candidates on --gpus {options.gpus}: {e}"]
    ids = worker_gpu_ids(pcfg, options, group) or []
    beyond = sorted({d for d in ids if not (d.isdigit() and int(d) < options.gpus)}, key=lambda d: (len(d), d))
    if not beyond:
        return []
    return [
        f"pofe.candidates.worker_devices {c.worker_devices} names GPU(s) {', '.join(beyond)}, which --gpus "
        f"{options.gpus} (GPU{f's 0-{options.gpus - 1}' if options.gpus > 1 else ' 0'}) has not: their workers "
        "would find no GPU. List only GPUs "
        f"below {options.gpus} there, or drop worker_devices and set num_workers to spread the workers over the "
        "GPUs there are"
    ]


def co_resident(parts: dict, pcfg: PofeConfig, options: PlanOptions, group: int = 1) -> dict:
    """`parts` with the other workers on the same GPU added (each holds its own model)."""
    n = workers_per_gpu(pcfg, options, group) if options.device == "cuda" else 1
    if n == 1 or any(v is None for v in parts.values()):
        return parts
    return {**parts, f"{n - 1}_more_workers_on_this_gpu": (n - 1) * sum(parts.values())}


def vllm_dtype(requested: str, size: ModelSize) -> str:
    """vLLM's `dtype`: auto takes the checkpoint's, and a float32 checkpoint in bfloat16."""
    if requested in mem.DTYPE_BYTES:
        return requested
    return "bfloat16" if size.dtype == "float32" else size.dtype


def vllm_parts(
    pcfg: PofeConfig, size: ModelSize | None, options: PlanOptions, where: str
) -> tuple[dict, str, int, list[str]]:
    """(parts, dtype, tensor parallel size, warnings) of the vLLM engine generation runs on this
    machine (`served_vllm`): its weights and one max_model_len sequence's KV cache, inside its
    gpu_memory_utilization share of each GPU (`reserved`: the rest of the share, KV cache);
    `where` names the stage in a warning when they do not fit in the share."""
    kwargs, tp = served_vllm(pcfg)
    util = float(kwargs.get("gpu_memory_utilization", VLLM_UTILIZATION))
    if size is None:
        return _unknown(("weights", "kv_cache_one_sequence", "reserved")), str(kwargs.get("dtype", "auto")), tp, []
    dtype = vllm_dtype(str(kwargs.get("dtype", "auto")), size)
    max_len = int(kwargs.get("max_model_len") or size.max_position)
    parts = {
        "weights": mem.weights_bytes(size, dtype) / tp,
        "kv_cache_one_sequence": mem.kv_bytes_per_token(size, dtype) * max_len / tp,
    }
    need = sum(parts.values()) + options.runtime
    share = util * options.gpu_memory_gb * mem.GB
    parts["reserved"] = max(share, need) - parts["weights"] - parts["kv_cache_one_sequence"]
    warnings = []
    if need > share:
        warnings.append(
            f"{where}: vLLM needs {need / mem.GB:.1f} GB per GPU for the weights and one "
            f"max_model_len = {max_len} sequence's KV cache, over its gpu_memory_utilization share "
            f"({util} x {options.gpu_memory_gb:g} GB): lower pofe.generate.vllm_kwargs.max_model_len or "
            "raise tensor_parallel_size / gpu_memory_utilization"
        )
    return parts, dtype, tp, warnings


def served_vllm(pcfg: PofeConfig) -> tuple[dict, int] | None:
    """(vLLM's settings, tensor parallel size) when generation runs vLLM on this machine."""
    g = pcfg.generate
    if g.backend == "vllm":
        return g.vllm_kwargs, int(g.vllm_kwargs.get("tensor_parallel_size", 1))
    if g.backend == "openai" and g.serve is not None:  # a server POFE starts: read its flags
        words = shlex.split(g.serve.command)
        flags = {w.lstrip("-").replace("-", "_"): v for w, v in zip(words, words[1:]) if w.startswith("--")}
        return flags, g.serve.tensor_parallel_size
    return None


def generate_stage(
    raw: dict,
    pcfg: PofeConfig,
    size: ModelSize | None,
    t: int,
    model: str,
    per_prompt: list[int] | None,
    options: PlanOptions,
) -> tuple[dict, list[str]]:
    """Sampling the K candidates: vLLM's share of each GPU, or the transformers policy with its
    KV cache; (entry, warnings)."""
    g, workers, warnings = pcfg.generate, pcfg.candidates.num_workers, []
    counts = {
        "prompts": None if per_prompt is None else len(per_prompt),
        "candidates": None if per_prompt is None else sum(per_prompt),  # the dataset's responses included
        "sampled": None if per_prompt is None else len(per_prompt) * g.num_candidates,
    }
    vllm = served_vllm(pcfg) if options.device == "cuda" else None
    if g.backend == "openai" and vllm is None:
        servers = [g.base_url] if isinstance(g.base_url, str) else g.base_url or []
        return stage(
            "generate",
            t,
            ", ".join(servers),
            dtype="-",
            parts={},
            options=options,
            device="remote",
            counts=counts,
            note="an OpenAI-compatible server elsewhere",
        ), warnings
    if vllm is not None:
        parts, dtype, tp, said = vllm_parts(pcfg, size, options, f"round {t} generate")
        warnings += said
        note = "vLLM takes gpu_memory_utilization of each GPU; all but the weights is KV cache"
        return stage(
            "generate",
            t,
            model,
            dtype=dtype,
            parts=co_resident(parts, pcfg, options, tp),
            options=options,
            gpus=worker_gpus(pcfg, options, tp),
            tp=tp,
            dp=workers,
            counts=counts,
            note=note,
        ), warnings
    return _hf_generate(raw, pcfg, size, t, model, counts, options), warnings


def hf_sampling_bytes(raw: dict, pcfg: PofeConfig, size: ModelSize, dtype: str) -> dict[str, float]:
    """What the transformers backend holds beside its weights while it samples a batch of
    `generate.batch_size` prompts x num_candidates sequences of prompt (max_prompt_tokens, else
    sequence_len) + max_new_tokens tokens: their KV cache, and one decode step's forward (one
    layer's values and a row of fp32 logits per sequence)."""
    g = pcfg.generate
    sequences = g.batch_size * g.num_candidates
    tokens = (g.max_prompt_tokens or int(raw.get("sequence_len", 2048))) + g.max_new_tokens
    return {
        "kv_cache": mem.kv_bytes_per_token(size, dtype) * sequences * tokens,
        "forward": mem.forward_bytes(size, sequences, dtype) + mem.logit_chunk_bytes(size, sequences),
    }


def _hf_generate(raw, pcfg, size, t, model, counts, options) -> dict:
    """The transformers backend: the policy (fp32 on the CPU, bf16 on a GPU) and what it samples
    with (`hf_sampling_bytes`)."""
    dtype = "float32" if options.device == "cpu" else "bfloat16"
    if size is None:
        parts = _unknown(("weights", "kv_cache", "forward", "runtime"))
    else:
        parts = {
            "weights": mem.weights_bytes(size, dtype),
            **hf_sampling_bytes(raw, pcfg, size, dtype),
            "runtime": options.runtime,
        }
    workers = pcfg.candidates.num_workers
    return stage(
        "generate",
        t,
        model,
        dtype=dtype,
        parts=co_resident(parts, pcfg, options),
        options=options,
        gpus=worker_gpus(pcfg, options),
        dp=workers,
        counts=counts,
    )


def judge_calls(pcfg: PofeConfig, per_prompt: list[int] | None) -> int | None:
    """The judge's calls for the round: per prompt, one per candidate, or one per ordered pair,
    K(K-1), as its type says (`JudgeSpec.calls`: PairRM and pairwise LLMs judge every ordered
    pair; GPM embeds each candidate once)."""
    if per_prompt is None:
        return None
    return sum(pcfg.judge.spec.judge_calls(k) for k in per_prompt)


def judge_parts(judge, size: ModelSize | None, options: PlanOptions) -> tuple[str, dict]:
    """(dtype, parts) of a judge model on its device: a reward model or GPM in its checkpoint's
    dtype (or `judge.dtype`), an encoder (PairRM's DeBERTa) in float32 with eager
    (disentangled: content and two position) attention."""
    shares = "prefix_sharing" in judge.spec.keys and judge.prefix_sharing
    if size is None:
        return judge.dtype, _unknown(("weights", "forward") + ("prefix_kv",) * shares + ("runtime",))
    if judge.spec.model_kind == "encoder":
        dtype, rows = "float32", judge.batch_size * judge.max_length
        forward = mem.forward_bytes(size, rows, dtype, attention_rows=3 * rows * judge.max_length)
    else:
        dtype = size.dtype if judge.dtype == "auto" else judge.dtype  # auto: the checkpoint's, on any device
        forward = mem.forward_bytes(size, judge.batch_size * judge.max_length, dtype)
    parts = {"weights": mem.weights_bytes(size, dtype), "forward": forward}
    if shares:
        # a window's prompt keys and values (up to batch_size x max_length tokens) and one batch's
        # gathered copy (judges/shared_prefix.py); counted whenever on, an encoder (which does not
        # share) included
        parts["prefix_kv"] = 2 * mem.kv_bytes_per_token(size, dtype) * judge.batch_size * judge.max_length
    return dtype, {**parts, "runtime": options.runtime}


def judge_stage(
    pcfg: PofeConfig, size: ModelSize | None, t: int, per_prompt: list[int] | None, options: PlanOptions
) -> dict:
    judge, workers = pcfg.judge, pcfg.candidates.num_workers
    counts = {"judge_calls": judge_calls(pcfg, per_prompt), "pairwise": judge.spec.pairwise}
    if judge.spec.calls_functions:
        return stage(
            "judge",
            t,
            judge.function or "reward_funcs",
            dtype="-",
            parts={},
            options=options,
            device="cpu",
            counts=counts,
            note="Python functions, no model",
        )
    if not judge.spec.loads_weights:  # a server's
        return stage(
            "judge",
            t,
            judge.model or "",
            dtype="-",
            parts={},
            options=options,
            device="remote",
            counts=counts,
            note=f"an OpenAI-compatible server at {judge.base_url}",
        )
    dtype, parts = judge_parts(judge, size, options)
    return stage(
        "judge",
        t,
        judge.model,
        dtype=dtype,
        parts=co_resident(parts, pcfg, options),
        options=options,
        gpus=worker_gpus(pcfg, options),
        dp=workers,
        counts=counts,
    )
