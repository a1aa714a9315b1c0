"""`generate.backend: vllm` online: vLLM in the training process, asleep between refreshes.

TRL's `VLLMGeneration` in its colocate mode (GRPO's `vllm_mode: colocate`) holds the engine:
built at the first refresh with sleep mode on (`vllm_kwargs` pass `gpu_memory_utilization`,
`max_model_len`, `tensor_parallel_size`), the policy's weights pushed into it at each refresh
(`sync_weights`: an adapter merged, pushed and unmerged; ZeRO-3's shards gathered), woken to
sample and put back to sleep, so the optimizer state and vLLM's KV cache share the GPU in turn.
The candidates are the ids vLLM sampled; `Completions` below gives them the candidate
pipeline's shape.

vLLM runs in the training venv only on GPU installs (`pip install '.[vllm]'`): the CPU build
pins another torch. What is tested without a GPU is everything up to the engine: the choice of
this sampler, the engine's settings, and what its output becomes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pofe.args.online import GPU_SHARE
from pofe_candidates.config import GenerateConfig, Sampling
from pofe_candidates.generators import Completion
from pofe_candidates.generators.hf import stop_token_ids
from pofe_candidates.render import Rendered


def engine_settings(generate: GenerateConfig) -> dict:
    """`VLLMGeneration`'s keyword arguments for the recipe's generate block."""
    kwargs = generate.vllm_kwargs
    return {
        "mode": "colocate",
        "enable_sleep_mode": True,
        "tensor_parallel_size": int(kwargs.get("tensor_parallel_size", 1)),
        "gpu_memory_utilization": float(kwargs.get("gpu_memory_utilization", GPU_SHARE)),
        "max_model_length": kwargs.get("max_model_len"),
        "temperature": generate.temperature,
        "top_p": generate.top_p,
        "top_k": generate.top_k,
        "max_completion_length": generate.max_new_tokens,
    }


def completions(completion_ids: list[list[int]], n: int, tokenizer, stops: list[int]) -> list[list[Completion]]:
    """TRL's colocated output (one row per sample, each prompt's n in a row) as P lists of n
    candidates: the text without special tokens, "stop" when a stop token ended it (kept in the
    ids, as engines return it), else "length"."""
    out = []
    for start in range(0, len(completion_ids), n):
        row = []
        for ids in completion_ids[start : start + n]:
            end = next((t for t, tok in enumerate(ids) if tok in stops), None)
            ids = ids if end is None else ids[: end + 1]
            text = tokenizer.decode([t for t in ids if t not in stops], skip_special_tokens=True)
            row.append(Completion(text, "length" if end is None else "stop", ids))
        out.append(row)
    return out


class ColocatedSampler:
    """The run's colocated engine, made at the first refresh and kept."""

    def __init__(self, generate: GenerateConfig, trainer):
        self.generate, self.trainer = generate, trainer
        self.engine = None

    def generator(self, model: torch.nn.Module, folder: Path) -> ColocatedGenerator:
        if self.engine is None:
            from trl.generation.vllm_generation import VLLMGeneration

            trainer = self.trainer
            self.engine = VLLMGeneration(
                model=trainer.model,
                accelerator=trainer.accelerator,
                processing_class=trainer.processing_class,
                **engine_settings(self.generate),
            )
        self.engine.sync_weights()
        return ColocatedGenerator(
            self.engine, self.trainer.processing_class, stop_token_ids(model, self.trainer.processing_class)
        )

    def close(self) -> None:
        """The engine goes with the process."""


class ColocatedGenerator:
    """One refresh's view of the engine, as the candidate pipeline calls a backend."""

    name = "vllm (colocated)"

    def __init__(self, engine, tokenizer, stops: list[int]):
        self.engine, self.tokenizer, self.stops = engine, tokenizer, stops

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[Completion]]:
        # colocated, TRL samples one completion per prompt it is given: each prompt n times
        repeated = [list(p.ids) for p in prompts for _ in range(n)]
        _, completion_ids, _, _ = self.engine.generate(repeated, None, num_generations=n)
        return completions(completion_ids, n, self.tokenizer, self.stops)
