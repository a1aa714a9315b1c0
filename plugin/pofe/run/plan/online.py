"""An online run's stage (`pofe.online`) in a plan (`pofe.run.plan.planner`).

An online run is one `axolotl train` process on each training GPU that samples, judges and
trains (`pofe.online.trainer`): the generator, the judge and pi_0 are not stages of their own,
one model at a time, but share the GPU with the training state for the whole run. The plan
lists one train stage whose parts are the training state's (`pofe.run.plan.training.train_memory`)
and, beside them (`online_parts`):

- generate_kv_cache, generate_forward: the training model samples its own candidates
  (generate.backend transformers: no second copy of the weights), in the training dtype, a
  batch of generate.batch_size prompts x num_candidates sequences at a time
  (`pofe.run.plan.candidates.hf_sampling_bytes`); generate_vllm_share: colocated vLLM
  (generate.backend vllm, `pofe.online.colocated`) takes gpu_memory_utilization of the GPU
  during a refresh; a server (openai) holds nothing here;
- zero3_gathered_weights: under ZeRO-3, TRL's `unwrap_model_for_generation` gathers the whole
  weights on every rank for a refresh (`pofe.online.models.policy_for_refresh`);
- judge_*: a judge that loads weights (a reward model, PairRM, GPM), loaded at the first refresh and kept for the run, as its
  own judge stage sizes it (`pofe.run.plan.candidates.judge_parts`) but for the CUDA context,
  which the process has once; a Python judge, and an LLM judge's server, hold nothing here;
- pi_0_weights: under full fine-tuning, when a refresh scores pi_0 (pofe.online.kl_coef > 0,
  pofe.anchor_mix, a method that reads pi_0 in its loss) or a method samples its opponent from
  the mixture (Nash-MD), a frozen copy of the base model in the recipe's dtype
  (`pofe.online.models.Pi0Policy`); under LoRA/QLoRA pi_0 is the policy with its adapter
  disabled: no copy;
- mixture_*: a method that plays the mixture (Nash-MD) samples its opponents with the training
  model whatever generate.backend, pi_0 beside it token by token (`pofe.online.mixture`): pi_0's
  KV cache for those sequences (mixture_pi_0_kv_cache, as large as the policy's), and with a
  vLLM backend the training model's own cache and decode step too (mixture_kv_cache,
  mixture_forward), which the transformers backend's generate_* already count.

Each part is counted at its own peak and the parts are summed: a bound, as a refresh runs
between optimizer steps, when the last step's activations are freed. The no-grad passes that
score a refresh's candidates (the policy's, pi_0's) hold one layer's values at a time, less
than those activations: not added.
"""

from __future__ import annotations

from pofe.args import PofeConfig
from pofe.args.online import GPU_SHARE
from pofe.methods import method_spec
from pofe.run.plan import estimate as mem
from pofe.run.plan.candidates import hf_sampling_bytes, judge_parts
from pofe.run.plan.common import PlanOptions, compute_dtype, deepspeed_config
from pofe.run.plan.estimate import GB, ModelSize
from pofe.run.plan.training import train_stage

NOTE = (
    "pofe.online: generate, judge and train share the training GPU(s), in one axolotl train process per GPU; "
    "parts summed"
)


def online_parts(
    raw: dict, pcfg: PofeConfig, size: ModelSize | None, judge_size: ModelSize | None, options: PlanOptions
) -> dict[str, float | None]:
    """Per-GPU bytes an online run holds beside the training state, by part (the module
    docstring says what each is); None where a model is not sized."""
    dtype = compute_dtype(raw, options.device)
    full = not raw.get("adapter")
    parts = generation_parts(raw, pcfg, size, dtype, options)
    weights = None if size is None else mem.weights_bytes(size, dtype)
    if full and deepspeed_config(raw).get("stage") == 3:
        parts["zero3_gathered_weights"] = weights
    if pcfg.judge.spec.loads_weights:
        _, judge = judge_parts(pcfg.judge, judge_size, options)
        parts |= {f"judge_{k}": v for k, v in judge.items() if k != "runtime"}
    spec = method_spec(pcfg.method)
    if full and (pcfg.online_scores_pi_0 or spec.opponent == "mixture"):
        parts["pi_0_weights"] = weights
    if spec.opponent == "mixture":
        parts |= mixture_parts(raw, pcfg, size, dtype)
    return parts


def mixture_parts(raw: dict, pcfg: PofeConfig, size: ModelSize | None, dtype: str) -> dict:
    """What sampling the opponents from the mixture holds (the module docstring): pi_0's KV cache
    beside the policy's, and the policy's own when generate.backend is not the training model."""
    sampling = dict.fromkeys(("kv_cache", "forward")) if size is None else hf_sampling_bytes(raw, pcfg, size, dtype)
    parts = {"mixture_pi_0_kv_cache": sampling["kv_cache"]}
    if pcfg.generate.backend != "transformers":
        parts |= {"mixture_kv_cache": sampling["kv_cache"], "mixture_forward": sampling["forward"]}
    return parts


def generation_parts(raw: dict, pcfg: PofeConfig, size: ModelSize | None, dtype: str, options: PlanOptions) -> dict:
    """What sampling holds on a training GPU, by generate.backend: the training model's KV cache
    and decode step (transformers); colocated vLLM's share of the GPU, its weights and KV cache
    inside it, awake for a refresh (vllm); nothing for a server, whose memory is its own (openai)."""
    backend = pcfg.generate.backend
    if backend == "openai":
        return {}
    if backend == "vllm":
        share = float(pcfg.generate.vllm_kwargs.get("gpu_memory_utilization", GPU_SHARE))
        return {"generate_vllm_share": share * options.gpu_memory_gb * GB}
    sampling = dict.fromkeys(("kv_cache", "forward")) if size is None else hf_sampling_bytes(raw, pcfg, size, dtype)
    return {f"generate_{k}": v for k, v in sampling.items()}


def online_stage(
    raw: dict,
    pcfg: PofeConfig,
    size: ModelSize | None,
    judge_size: ModelSize | None,
    per_prompt: list[int] | None,
    options: PlanOptions,
) -> dict:
    """The run's one stage, of no round (the run has none): training with `online_parts` beside
    it; `per_prompt`: each prompt's candidates (`pofe.run.plan.common.round_candidates`)."""
    beside = online_parts(raw, pcfg, size, judge_size, options)
    return train_stage(raw, pcfg, size, None, str(raw["base_model"]), per_prompt, options, beside, NOTE)
