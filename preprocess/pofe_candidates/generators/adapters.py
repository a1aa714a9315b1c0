"""PEFT adapters as vLLM serves them: a policy folder holding an adapter runs as its base
model plus a LoRA request (in process) or a LoRA module (served). Standard library only:
the served backend runs in venvs without vLLM."""

from __future__ import annotations

import json
from pathlib import Path

# vLLM's accepted max LoRA ranks (vllm.config.lora.MaxLoRARanks); its default is 16.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_DEFAULT_LORA_RANK = 16


def read_adapter(path: str | Path) -> dict | None:
    """A PEFT adapter folder's adapter_config.json (its base and rank), or None for a model."""
    config = Path(path) / "adapter_config.json"
    return json.loads(config.read_text()) if config.exists() else None


def max_lora_rank(rank: int, adapter_path: str | Path) -> int | None:
    """The max LoRA rank vLLM must be started with for an adapter of `rank`: None when its
    default covers it, else the smallest accepted value at or above `rank`."""
    if rank <= VLLM_DEFAULT_LORA_RANK:
        return None
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"LoRA adapter {adapter_path} has rank {rank}; vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}")
    return fits[0]
