"""OpenAI-compatible backend: `/v1/completions` with `n` samples per prompt.

Works with `vllm serve` / `python -m vllm.entrypoints.openai.api_server`, `axolotl vllm-serve`
and other OpenAI-compatible servers, on this machine or another node. Prompts are sent already
rendered with the policy's chat template (the completions route, not chat), so the candidates
continue exactly the text the trainer will condition on.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..config import Sampling
from ..openai_client import EndpointError, OpenAIClient
from .base import Completion


class OpenAIGenerator:
    """Reproducibility: prompt i of a call is sent with `seed = sampling.seed + i` (servers that
    honour `seed`, such as vLLM, then return the same samples)."""

    name = "openai"

    def __init__(self, client: OpenAIClient, model: str, *, concurrency: int = 8):
        self.client = client
        self.model = model
        self.concurrency = concurrency

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[str]]:
        """prompts: P rendered strings -> P lists of n candidates (order preserved)."""
        if sampling.strategy != "sample":
            raise ValueError(
                f"the openai backend supports strategy 'sample' only, got {sampling.strategy!r}"
            )

        def one(i: int) -> list[str]:
            payload = {
                "model": self.model,
                "prompt": prompts[i],
                "n": n,
                "max_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "seed": sampling.seed + i,
            }
            if sampling.top_k > 0:
                payload["top_k"] = sampling.top_k  # vLLM extension of the OpenAI schema
            choices = self.client.completions(payload)
            if len(choices) != n:
                raise EndpointError(
                    f"{self.client.base_url}/completions",
                    f"asked for n={n} completions, got {len(choices)}",
                    1,
                    "The server must honour the completions API's `n` (vLLM does); check base_url.",
                )
            # finish_reason: "stop" or "length", the completions API's values (unknown if absent)
            return [Completion(c["text"], c["finish_reason"]) if c.get("finish_reason") else c["text"] for c in choices]

        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
            return list(pool.map(one, range(len(prompts))))
