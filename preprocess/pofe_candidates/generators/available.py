"""Whether a generation backend can run in this environment, asked when the recipe is read
(`axolotl pofe run` before its first stage, `axolotl train` of an online recipe before its
model loads), not at the first shard or the first refresh.

`generate.backend: vllm` runs vLLM in POFE's own process: offline in the candidate pipeline
(`vllm.py`), online colocated in each training process on its GPU (TRL's colocate mode,
`pofe.online.colocated`). Without vLLM installed, TRL's own check would end the first refresh
with "pip install trl[vllm]", which installs neither POFE's pins nor axolotl's.
"""

from __future__ import annotations

import importlib.util

import torch

from pofe.errors import PofeError
from pofe_candidates.config import GenerateConfig

# the README's install line for vLLM in POFE's venv: axolotl's own `vllm` extra, through POFE's
VLLM_INSTALL = "pip install '.[vllm]'"


class BackendUnavailable(PofeError, ValueError):
    """The recipe's generation backend cannot run here: what is missing and what to do."""


def check_backend_runs(generate: GenerateConfig | None, *, online: bool) -> None:
    """Raise `BackendUnavailable` when `generate.backend: vllm` cannot run here: vLLM not
    installed, or (online: colocated on the training GPU) no CUDA GPU. Other backends need
    nothing of this environment (transformers) or run elsewhere (a server); no generate block
    (rows already judged), nothing."""
    if generate is None or generate.backend != "vllm":
        return
    where = (
        "pofe.online with generate.backend: vllm runs vLLM in each training process, on its GPU (colocated)"
        if online
        else "generate.backend: vllm runs vLLM in POFE's process"
    )
    instead = (
        "or set generate.backend: transformers (the training model samples its candidates) or openai (a vLLM "
        "server, with adapter: lora or qlora)"
        if online
        else "or sample from a vLLM in a venv of its own: generate.serve (POFE starts it for each round), or "
        "generate.backend: openai with generate.base_url"
    )
    if importlib.util.find_spec("vllm") is None:
        raise BackendUnavailable(
            f"{where}, and this environment has no vllm: install POFE with it, `{VLLM_INSTALL}` (on a GPU "
            f"machine: vLLM's CPU build pins another torch than axolotl's, so it cannot share this venv), {instead}."
        )
    if online and not torch.cuda.is_available():
        raise BackendUnavailable(f"{where}, and this machine has no CUDA GPU: {instead.removeprefix('or ')}.")


__all__ = ["VLLM_INSTALL", "BackendUnavailable", "check_backend_runs"]
