"""`pofe.pipeline`: where and how the candidate pipeline writes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pofe.methods import method_spec

from .base import StrictConfig


class PipelineConfig(StrictConfig):
    """Where and how the pipeline writes."""

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

    def for_method(self, method: str) -> PipelineConfig:
        """This config with `truncated` resolved: as set, else the method's default."""
        if self.truncated is not None:
            return self
        return self.model_copy(update={"truncated": method_spec(method).truncated_candidates})
