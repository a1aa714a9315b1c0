"""Candidate generation: one small interface, three backends.

    generator = make_generator(cfg, policy_path)
    candidates = generator.generate(rendered_prompts, n, cfg.sampling())   # P x n Completions

Each backend gets every prompt as the trainer's token ids (`render.Rendered.ids`) and returns
the ids it sampled where it can (`Completion.token_ids`), so training scores what was sampled.

Backends: `transformers` (hf.py: local `model.generate`: sample, beam, diverse_beam),
`openai` (openai.py: any OpenAI-compatible server's /v1/completions: sample; with
`generate.serve`, served.py starts that server for the policy and stops it on `close()`),
`vllm` (vllm.py: in-process vllm.LLM: sample). Heavy imports happen only when a backend is built;
whether one can run here is asked when a recipe is read (available.py).
A new backend is one module here implementing `base.Generator`, and one branch below.
"""

from __future__ import annotations

from pofe_candidates.config import GenerateConfig
from pofe_candidates.generators.interface import Completion, Generator, finish_reason, sampled_ids


def make_generator(cfg: GenerateConfig, policy_path: str, tokenizer=None, workdir=None) -> Generator:
    """Build the configured backend; `cfg.model` overrides the policy path (or served name).
    `tokenizer`: the transformers backend's, when the caller has the training one.
    `workdir`: where a served policy's server log goes (a temporary folder when None)."""
    model = cfg.model or policy_path
    if cfg.serve is not None:
        from pofe_candidates.generators.served import ServedGenerator

        return ServedGenerator(cfg, model, workdir)
    if cfg.backend == "transformers":
        from pofe_candidates.generators.hf import TransformersGenerator

        return TransformersGenerator(model, batch_size=cfg.batch_size, tokenizer=tokenizer)
    if cfg.backend == "openai":
        from pofe_candidates.generators.openai import OpenAIGenerator
        from pofe_candidates.replicas import client_for
        from pofe_candidates.server_window import server_window

        client = client_for(cfg)
        # the stage's window: as set, else what each server's /v1/models says it runs
        window = cfg.in_flight or server_window(client, "generate.in_flight")
        return OpenAIGenerator(client, model, concurrency=window, prompt_as=cfg.openai_prompt)
    if cfg.backend == "vllm":
        from pofe_candidates.generators.vllm import VLLMGenerator

        return VLLMGenerator(model, in_flight=cfg.in_flight, seed=cfg.seed, **cfg.vllm_kwargs)
    raise ValueError(f"unknown generate.backend {cfg.backend!r}")


__all__ = ["Completion", "Generator", "finish_reason", "make_generator", "sampled_ids"]
