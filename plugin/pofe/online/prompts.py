"""An online run's training set: its prompts, not candidates (those come at each refresh).

Each row is one prompt as the candidate pipeline reads it (`pofe.data.formats.prompt_row`,
checked as `axolotl preprocess` checks it), JSON-encoded so any column layout fits one
dataset schema, with its index in the recipe's dataset. The prompts held out for `axolotl
pofe eval` (`pofe.eval.held_out`) are left out, as offline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from axolotl.common.datasets import TrainDatasetMeta
from axolotl.utils.dict import DictDefault
from datasets import Dataset

from pofe.args import PofeConfig
from pofe.collator import KResponseCollator
from pofe.data.formats import RowFormat, prompt_row
from pofe.data.held_out import held_out_count, hold_out, without_prompts
from pofe.data.loader import total_num_steps
from pofe.data.sources import load_entry
from pofe.logs import get_logger

LOG = get_logger(__name__)

PROMPT_INDEX = "prompt_index"
PROMPT_ROW = "prompt_row"
PROMPT_SOURCE = "prompt_source"  # its file and row (`prompt_source`)
PROMPT_COLUMNS = (PROMPT_INDEX, PROMPT_ROW, PROMPT_SOURCE)


def refresh_prompt_row(row: dict, index: int, fmt: RowFormat, include: list[str]) -> dict[str, Any]:
    """A prompt row as a refresh reads it: the candidate pipeline's (`prompt_row`, checked), its
    prompt under "prompt" whatever the dataset's `field_prompt` calls it, its other columns as
    they are (a reward function reads them). `index`: its row in its file."""
    checked = prompt_row(row, index, fmt, include)
    return {"prompt": checked.pop(fmt.column("field_prompt")), **checked}


def prompt_source(fmt: RowFormat, index: int) -> str:
    """Where a prompt comes from, as errors name it (a judge that failed on its candidates): its
    file and row, as the row checks say them; its index in the prompt set is no file's row once
    held-out prompts are left out, or past the first dataset."""
    return f"dataset {fmt.dataset}, row {index} (0-based)"


def load_online_prompts(cfg: DictDefault, pofe: PofeConfig) -> TrainDatasetMeta:
    """The prompts an online run trains on (the `load_datasets` hook's answer under `pofe.online`)."""
    held = held_out_count(pofe, cfg.datasets)
    parts = []
    for i, entry in enumerate(cfg.datasets):
        fmt = RowFormat.of_entry(entry, i, pofe)
        raw = load_entry(entry, cfg.hf_use_auth_token)
        rows_in_file = range(len(raw))
        if held:  # and any other row with one of their prompts, as offline
            raw, _, keys = hold_out(raw, fmt, held)
            before = len(raw)
            raw, rows_in_file = without_prompts(raw, fmt, keys)
            if before > len(raw):
                LOG.info(
                    f"POFE: {before - len(raw)} more rows of {entry.path} repeat a held-out prompt: not trained on"
                )
        include = pofe.generate.include_dataset_responses
        first = len(parts)  # the recipe's datasets, one after another
        parts += [
            {
                PROMPT_INDEX: first + j,
                PROMPT_ROW: json.dumps(refresh_prompt_row(row, r, fmt, include)),
                PROMPT_SOURCE: prompt_source(fmt, r),
            }
            for j, (r, row) in enumerate(zip(rows_in_file, raw, strict=True))
        ]
    prompts = Dataset.from_list(parts)
    every = pofe.online.refresh_every
    LOG.info(
        f"POFE: online {pofe.method}: {len(prompts)} prompts"
        + (f" ({held} held out for `axolotl pofe eval`)" if held else "")
        + f"; {pofe.generate.num_candidates} candidates per prompt sampled from the policy every {every} "
        "optimizer steps"
    )
    epoch = steps_per_epoch(cfg, len(prompts))
    if every > epoch:
        LOG.warning(
            f"POFE: pofe.online.refresh_every {every} is more than an epoch's {epoch} steps: a refresh's window "
            f"ends with its epoch (the next epoch's prompt order is drawn as it starts), so the candidates are "
            f"refreshed every {epoch} steps. Lower refresh_every to {epoch} to say so, or micro_batch_size for more "
            "steps per epoch"
        )
    return TrainDatasetMeta(
        train_dataset=prompts, eval_dataset=None, total_num_steps=total_num_steps(cfg, len(prompts))
    )


def steps_per_epoch(cfg: DictDefault, num_prompts: int) -> int:
    """Optimizer steps in one pass over `num_prompts` (transformers': ceil over the ranks' batches,
    then over gradient accumulation)."""
    batches = -(-num_prompts // ((cfg.micro_batch_size or 1) * (cfg.world_size or 1)))
    return max(1, -(-batches // (cfg.gradient_accumulation_steps or 1)))


@dataclass
class PromptCollator:
    """A batch of prompts: their indices and rows, for the trainer's next refresh.

    Built by axolotl as `cls(tokenizer, padding=..., pad_to_multiple_of=..., **kwargs)`; the
    trainer batches the refreshed candidates with `rows`, the offline collator.
    """

    tokenizer: Any
    padding: bool | str = True
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    prefix_sharing: bool = False

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            PROMPT_INDEX: torch.tensor([f[PROMPT_INDEX] for f in features]),  # (B,)
            PROMPT_ROW: [json.loads(f[PROMPT_ROW]) for f in features],
            PROMPT_SOURCE: [f[PROMPT_SOURCE] for f in features],
        }

    @property
    def rows(self) -> KResponseCollator:
        """The collator of the k-response rows a refresh makes."""
        return KResponseCollator(
            self.tokenizer, self.padding, self.pad_to_multiple_of, self.return_tensors, self.prefix_sharing
        )
