"""The `pofe.online` block: train on candidates sampled from the moving policy.

With it, `axolotl train` on a `pofe.prompts` dataset does not sample the candidates once
before training: every `refresh_every` optimizer steps the trainer samples them for the
prompts of the next `refresh_every` steps from the policy as it is then, judges them, and
trains on them (`pofe.online`). Declared here with the rules of the recipe around it
(pydantic only, no torch) so `pofe.args` imports it cheaply.
"""

from __future__ import annotations

import shlex
from functools import partial

from pydantic import Field

from pofe.methods import method_spec
from pofe_candidates.config.strict import KnownKeys

# colocated vLLM's share of each GPU beside training (generate.backend vllm), unless
# generate.vllm_kwargs sets gpu_memory_utilization; TRL's colocate examples use 0.3
GPU_SHARE = 0.3


class OnlineConfig(KnownKeys):
    """The `pofe.online` block."""

    refresh_every: int = Field(
        default=32,
        ge=1,
        description="Optimizer steps between refreshes: each refresh samples and judges the candidates of the "
        "prompts of the next refresh_every steps from the policy as it is (1: every step, on-policy; the steps "
        "of an epoch: the offline iteration). The optimizer and the schedule run on across refreshes.",
    )
    kl_coef: float = Field(
        default=0.0,
        ge=0.0,
        description="RRHF: each candidate's reward becomes reward - kl_coef * (log pi(y|x) - log pi_0(y|x)), "
        "the RRHF paper's fix for online reward hacking (it used 0.01). Nash-MD: tau, the weight of "
        "KL(pi || pi_0) in its loss. pi_0 is the base model (the adapter disabled under LoRA/QLoRA, a frozen "
        "copy under full fine-tuning). 0: off.",
    )
    monitor_every: int = Field(
        default=10,
        ge=0,
        description="Refreshes between monitor records (`pofe.online.monitor`): the policy's perplexity of the "
        "held-out prompts' reference responses (pofe.eval.prompts or pofe.eval.held_out, their "
        "pofe.eval.reference_column) as online/reference_perplexity, and monitor_samples sampled completions "
        "with their judgements in the console, output_dir/online/monitor.jsonl and the tracker's "
        "online/completions table. 0: off. Every 10th by default: a few lines a time in the console.",
    )
    monitor_samples: int = Field(
        default=2,
        ge=0,
        description="Prompts of a monitored refresh whose sampled completions are shown with their judgements "
        "(every sample of each in monitor.jsonl; in the console each distinct completion once, counted, the "
        "4 most frequent of a prompt).",
    )


def check_online_block(pofe) -> None:
    """What a `pofe.online` block (`pofe`: its PofeConfig, with a method) needs, and what it does not
    combine with (yet)."""
    if pofe.generate is None:
        raise ValueError(
            "pofe.online samples candidates during training: it needs a pofe.prompts dataset with "
            "pofe.generate and pofe.judge"
        )
    generate = pofe.generate
    if generate.serve is not None and "{lora_modules}" not in shlex.split(generate.serve.command):
        raise ValueError(
            "pofe.online with generate.serve loads each refresh's adapter into the server while it runs: add "
            "{lora_modules} to generate.serve.command (POFE fills it with --enable-lora and --max-lora-rank)"
        )
    spec = method_spec(pofe.method)
    if pofe.online.kl_coef and spec.target.from_win_rates and not spec.kl_in_loss:
        raise ValueError(
            f"pofe.online.kl_coef penalises the rewards a method trains on; `rl: {pofe.method}` trains on win "
            "rates and anchors each refresh to the policy that sampled it instead: drop kl_coef"
        )
    if pofe.rounds > 1:
        raise ValueError(
            "pofe.online refreshes the candidates inside one training, which replaces pofe.rounds: set "
            "rounds: 1 (or drop pofe.online to iterate offline rounds)"
        )
    if pofe.pi_0 is not None:
        raise ValueError(
            f"pofe.pi_0 ({pofe.pi_0}): online, pi_0 for pofe.anchor_mix is the recipe's base_model "
            "(the policy with its adapter disabled under LoRA/QLoRA, a frozen copy under full fine-tuning), as "
            "for kl_coef: drop pofe.pi_0, or set base_model to the model pi_0 should be"
        )


def check_online_recipe(data: dict, pofe) -> None:
    """The recipe around a `pofe.online` block (`data`: its top level, raw or validated; `pofe`:
    the block's PofeConfig): prompt datasets only, no val_set_size, LoRA for a served policy."""
    _check_datasets(data)
    _check_adapter(data, pofe.generate)


def _check_adapter(data: dict, generate) -> None:
    """A served policy is kept in step with the trained one by loading its LoRA adapter."""
    if generate.backend == "openai" and data.get("adapter") not in ("lora", "qlora"):
        raise ValueError(
            "pofe.online with generate.backend openai brings the server's policy in step at each refresh by "
            f"loading the trained LoRA adapter into it; this recipe trains every weight (adapter: "
            f"{data.get('adapter') or 'unset'}), whose sync needs NCCL between the trainer and the server "
            "(TRL's vllm-serve), on GPUs only, which POFE does not do. Set adapter: lora or qlora, or "
            "generate.backend: transformers (the training model samples)"
        )


def _check_datasets(data: dict) -> None:
    """`pofe.online` trains on prompts only, and evaluates with `axolotl pofe eval`."""
    for i, entry in enumerate(data.get("datasets") or []):
        get = entry.get if isinstance(entry, dict) else partial(getattr, entry)
        if get("type", None) != "pofe.prompts":
            raise ValueError(
                f"datasets[{i}] ({get('path', None)}): pofe.online samples every candidate from the policy as it "
                f"trains, so each dataset is a prompt set (type pofe.prompts), not {get('type', None)}"
            )
    if data.get("val_set_size"):
        raise ValueError(
            "val_set_size: an online run's rows are prompts, which have no loss to evaluate before their "
            "candidates are sampled; hold prompts out with pofe.eval.held_out and evaluate with `axolotl pofe eval`"
        )
