"""Candidate generation: one small interface, three backends.

    generator = make_generator(cfg, policy_path)
    candidates = generator.generate(rendered_prompts, n, cfg.sampling())   # P x n strings

Backends: `transformers` (local `model.generate`: sample, beam, diverse_beam), `openai`
(any OpenAI-compatible server's /v1/completions: sample), `vllm` (in-process vllm.LLM:
sample). Heavy imports happen only when a backend is built.
"""

from __future__ import annotations

from typing import Protocol

from .config import GenerateConfig, Sampling, read_api_key


class Generator(Protocol):
    name: str

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[str]]:
        """prompts: P rendered prompt strings -> P lists of exactly n candidates each."""
        ...


def make_generator(cfg: GenerateConfig, policy_path: str) -> Generator:
    """Build the configured backend; `cfg.model` overrides the policy path (or served name)."""
    model = cfg.model or policy_path
    if cfg.backend == "transformers":
        from .generate_transformers import TransformersGenerator

        return TransformersGenerator(model, batch_size=cfg.batch_size)
    if cfg.backend == "openai":
        from .generate_openai import OpenAIGenerator
        from .openai_client import OpenAIClient

        client = OpenAIClient(
            cfg.base_url,
            api_key=read_api_key(cfg.api_key_env),
            timeout=cfg.request_timeout,
            max_retries=cfg.max_retries,
        )
        return OpenAIGenerator(client, model, concurrency=cfg.batch_size)
    if cfg.backend == "vllm":
        from .generate_vllm import VLLMGenerator

        return VLLMGenerator(model, seed=cfg.seed, **cfg.vllm_kwargs)
    raise ValueError(f"unknown generate.backend {cfg.backend!r}")


def load_policy_tokenizer(policy_path: str):
    """The tokenizer whose chat template renders prompts (the policy's, not the judge's)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_path)
