"""Which generator samples a refresh: the training model itself, or a vLLM server kept in step.

    generate.backend: transformers   the policy samples in the training process, as it is at
                                     the refresh (`TransformersGenerator.of_model`)
    generate.backend: vllm           vLLM in the training process, asleep between refreshes, the
                                     policy's weights pushed into it at each (`colocated.py`)
    generate.backend: openai         LoRA/QLoRA: a vLLM OpenAI-compatible server of the base
                                     model, started at the first refresh from `generate.serve`
                                     (or one the user runs, `generate.base_url`) and kept up for
                                     the run. Each refresh saves the adapter to
                                     `refresh-<step>/adapter/`, loads it into the server under a
                                     name of its own (vLLM's runtime LoRA routes), unloads the
                                     previous refresh's, and samples with it; the sampled token
                                     ids come back with the text (`return_token_ids`), and the
                                     trainer scores those.

A name per refresh, not one adapter reloaded in place (axolotl's async GRPO does that): vLLM
keys its prefix cache and its LoRA cache by the adapter's id, which an in-place reload keeps, so
blocks computed with the previous refresh's weights would be reused. TRL's `VLLMClient` talks to
`trl vllm-serve`'s own routes (NCCL weight updates), not to an OpenAI-compatible server, so the
candidate pipeline's client (`pofe_candidates.openai_client`) sends these requests.

Full fine-tuning has no served path: syncing every weight takes NCCL between the trainer and
the server (TRL's vllm-serve), on GPUs only; `pofe.args` refuses it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pofe.errors import PofeError
from pofe.logs import get_logger
from pofe_candidates.config import GenerateConfig
from pofe_candidates.generators import make_generator
from pofe_candidates.generators.adapters import max_lora_rank, read_adapter
from pofe_candidates.generators.hf import TransformersGenerator
from pofe_candidates.generators.openai import OpenAIGenerator
from pofe_candidates.generators.served import RUNTIME_LORA_ENV, ServedGenerator, ServerExited
from pofe_candidates.openai_client import EndpointError, OpenAIClient

LOG = get_logger(__name__)

ADAPTER = "adapter"  # the folder, in a refresh's, of the adapter it sampled with
LORA_PREFIX = "pofe-online"  # the served adapter of refresh-<step> is pofe-online-refresh-<step>


class ServedSamplingError(PofeError, RuntimeError):
    """The served policy cannot be brought in step with the trained one."""


class ModelSampler:
    """`generate.backend: transformers`: the training model samples its own candidates."""

    def __init__(self, generate: GenerateConfig, tokenizer):
        self.generate, self.tokenizer = generate, tokenizer

    def generator(self, model: torch.nn.Module, folder: Path) -> TransformersGenerator:
        return TransformersGenerator.of_model(model, self.tokenizer, batch_size=self.generate.batch_size)

    def close(self) -> None:
        """Nothing runs between refreshes."""


class ServedSampler:
    """`generate.backend: openai` under LoRA/QLoRA: the server, and the adapter it samples with."""

    def __init__(self, generate: GenerateConfig, log_dir: Path):
        self.generate, self.log_dir = generate, log_dir
        self.served: ServedGenerator | None = None  # with generate.serve: the server started here
        self.requests: OpenAIGenerator | None = None  # what names the adapter in each request
        self.loaded: str | None = None  # the adapter the last refresh loaded

    def generator(self, model: torch.nn.Module, folder: Path) -> ServedGenerator | OpenAIGenerator:
        """The generator of this refresh: `model` (the unwrapped PeftModel)'s adapter saved in
        `folder/adapter/`, loaded into the server, the previous refresh's unloaded."""
        adapter = folder / ADAPTER
        model.save_pretrained(str(adapter))  # a PeftModel writes its adapter only
        generator = self._connected(adapter)
        name = f"{LORA_PREFIX}-{folder.name}"
        for client in getattr(self.requests.client, "clients", [self.requests.client]):  # each replica's
            self._load(client, name, adapter)
            if self.loaded is not None:
                client.post_text("unload_lora_adapter", {"lora_name": self.loaded})
        self.loaded = self.requests.model = name
        return generator

    def _connected(self, adapter: Path) -> ServedGenerator | OpenAIGenerator:
        """The generator of the run: made at the first refresh (the server started, with
        generate.serve), kept after."""
        if self.served is not None and self.served.server.exit_code is not None:
            raise ServerExited(self.served.server.describe("exited between two refreshes"))
        if self.requests is not None:
            return self.served or self.requests
        config = read_adapter(adapter)
        base = self.generate.model or config["base_model_name_or_path"]
        if self.generate.serve is None:
            self.requests = make_generator(self.generate, base)
            return self.requests
        LOG.info(f"POFE: online: starting the server of {base} (its log: {self.log_dir / 'server.log'})")
        rank = max_lora_rank(config["r"], adapter)
        self.served = ServedGenerator.loading_adapters(self.generate, base, rank, self.log_dir)
        self.requests = self.served.inner
        return self.served

    def _load(self, client: OpenAIClient, name: str, adapter: Path) -> None:
        load = {"lora_name": name, "lora_path": str(adapter.resolve())}
        try:
            try:
                client.post_text("load_lora_adapter", load)
            except EndpointError as e:
                if "has already been loaded" not in e.cause:
                    raise
                # left by an earlier run at this step (a killed one, on a server at base_url): replaced
                client.post_text("unload_lora_adapter", {"lora_name": name})
                client.post_text("load_lora_adapter", load)
        except EndpointError as e:
            raise ServedSamplingError(
                f"online refresh: loading the policy's adapter {adapter} into the server at {client.base_url} "
                f"failed: {e}. The server loads each refresh's adapter while it runs: start vLLM with "
                f"{RUNTIME_LORA_ENV}=True in its environment and --enable-lora --max-lora-rank at or above the "
                "adapter's lora_r, on a machine that reads output_dir (generate.serve does all of this)"
            ) from e

    def close(self) -> None:
        """Stop the server started here (a server at generate.base_url runs on, the last
        refresh's adapter loaded)."""
        if self.served is not None:
            self.served.close()
            LOG.info(f"POFE: online: stopped the server (exit code {self.served.server.exit_code})")


def sampler_for(generate: GenerateConfig, trainer, log_dir: Path, world: int):
    """The run's sampler (it starts nothing before the first refresh): `trainer` is the online
    trainer (its tokenizer; for a colocated engine, its model and accelerator)."""
    if generate.backend == "transformers":
        return ModelSampler(generate, trainer.processing_class)
    if generate.backend == "vllm":
        from pofe.online.colocated import ColocatedSampler

        return ColocatedSampler(generate, trainer)
    if world > 1:
        raise ServedSamplingError(
            f"pofe.online with generate.backend openai runs in one training process for now; this run has {world} "
            "(each would save its own adapter and, with generate.serve, start its own server). Train on one "
            "process, or set generate.backend: transformers or vllm (colocated: one engine per process)"
        )
    return ServedSampler(generate, log_dir)
