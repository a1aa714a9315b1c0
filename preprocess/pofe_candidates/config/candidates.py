"""`pofe.candidates`: where and how the candidate pipeline writes its shards and rows."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pofe.methods import method_spec
from pofe_candidates.config.strict import StrictConfig


class CandidatesConfig(StrictConfig):
    """The `pofe.candidates` block: where and how the pipeline writes."""

    out_dir: str | None = Field(
        None,
        description="Directory for shards, data.jsonl and summary.json (default: under "
        "dataset_prepared_path, named by a hash of the inputs and settings).",
    )
    shard_size: int = Field(64, ge=1, le=1_000_000, description="Prompts per shard (unit of resume).")
    keep: Literal["all", "best_worst"] = Field(
        "all",
        description="sppo: keep every candidate, or only the highest- and lowest-win-rate one "
        "(the SPPO paper's data-budget choice).",
    )
    min_candidates: int = Field(2, ge=2, description="Rows with fewer judged candidates are dropped (counted).")
    truncated: Literal["drop", "keep"] | None = Field(
        None,
        description="Candidates cut at generate.max_new_tokens (finish reason `length`): drop them "
        "(counted in summary.json's truncated_candidates_dropped) or keep them (trained as if "
        "finished: the end-of-turn token is appended). None: the method's default (pofe.methods: "
        "keep for RRHF and SPPO, as their authors' scripts do).",
    )
    progress: bool = Field(True, description="Show tqdm progress bars.")
    num_workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Processes that generate and judge the shards side by side: shard s belongs to "
        "worker s % num_workers, which generates all its shards, frees its generator, then judges "
        "them; this process waits and builds data.jsonl (byte for byte the one-process file: seeds "
        "are per shard). Each worker gets its own GPUs (worker_devices; else the visible GPUs in "
        "turn, tensor_parallel_size x pipeline_parallel_size of them per vLLM worker); on a CPU they "
        "share the cores. 1: all in this process.",
    )
    worker_devices: list[str] | None = Field(
        None,
        description="CUDA_VISIBLE_DEVICES for each worker, one entry per worker: ['0', '1'], or "
        "['0,1', '2,3'] for vLLM workers with tensor_parallel_size 2. None: the visible GPUs in turn.",
    )

    @model_validator(mode="after")
    def _check_workers(self) -> CandidatesConfig:
        if self.worker_devices is None:
            return self
        if self.num_workers == 1:
            raise ValueError(
                "pofe.candidates.worker_devices is for num_workers > 1; to place one process, set "
                "CUDA_VISIBLE_DEVICES for the run instead"
            )
        if len(self.worker_devices) != self.num_workers:
            raise ValueError(
                f"pofe.candidates.worker_devices has {len(self.worker_devices)} entries for num_workers="
                f"{self.num_workers}: give one CUDA_VISIBLE_DEVICES value per worker"
            )
        for i, devices in enumerate(self.worker_devices):
            if not all(d.strip() for d in devices.split(",")):
                raise ValueError(
                    f"pofe.candidates.worker_devices[{i}] = {devices!r} is not a comma-separated list of "
                    "GPU indices or UUIDs (e.g. '0' or '2,3')"
                )
        return self

    def for_method(self, method: str) -> CandidatesConfig:
        """This config with `truncated` resolved: as set, else the method's default."""
        if self.truncated is not None:
            return self
        return self.model_copy(update={"truncated": method_spec(method).truncated_candidates})
