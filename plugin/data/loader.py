"""`load_datasets` for POFE: k-response rows in, tokenised rows cached on disk out.

Loading, hashing, caching under `dataset_prepared_path`, the rank lock and the
train/validation split are axolotl's own helpers; POFE adds the row checks
(`formats.py`) and the prompt/response tokenisation (`tokenize.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import partial
from pathlib import Path
from typing import Any

from datasets import Dataset

from axolotl.common.datasets import TrainDatasetMeta
from axolotl.loaders import load_tokenizer
from axolotl.utils.data.lock import FileLockLoader
from axolotl.utils.data.shared import (
    create_train_validation_split,
    generate_dataset_hash_from_config,
    load_preprocessed_dataset,
    merge_datasets,
    save_preprocessed_dataset,
)
from axolotl.utils.dict import DictDefault

from ..args import PofeConfig
from ..logs import get_logger
from ..methods import method_spec
from .formats import RowFormat, check_columns, normalize_row, prompt_row
from .sources import load_entry, local_files_digest, read_json_rows
from .tokenize import tokenize_row

LOG = get_logger(__name__)

# Bump when the prepared row layout changes, so stale caches are not reused.
PREPARED_FORMAT_VERSION = 1


def load_pofe_datasets(cfg: DictDefault, pofe: PofeConfig, preprocess: bool = False) -> TrainDatasetMeta:
    """Build (or reuse) the tokenised k-response dataset described by `cfg`.

    `pofe` is `cfg`'s validated `pofe:` block, read once by the plugin's hook and passed down.
    """
    tokenizer = load_tokenizer(cfg)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {cfg.tokenizer_config or cfg.base_model} has no chat "
            "template; POFE renders prompts and responses with one: set "
            "`chat_template:` (e.g. chatml) in the recipe"
        )
    dataset_hash = prepared_dataset_hash(cfg, pofe, tokenizer)
    Path(cfg.dataset_prepared_path or "last_run_prepared").mkdir(parents=True, exist_ok=True)
    loader = FileLockLoader(cfg)
    try:
        dataset = loader.load(partial(_load_or_prepare, cfg, pofe, tokenizer, dataset_hash))
    finally:
        loader.cleanup()

    eval_dataset = None
    if cfg.val_set_size:
        dataset, eval_dataset = create_train_validation_split(dataset, cfg, cfg.val_set_size)
    return TrainDatasetMeta(
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        total_num_steps=_total_num_steps(cfg, len(dataset)),
    )


def prepared_dataset_hash(cfg: DictDefault, pofe: PofeConfig, tokenizer) -> str:
    """Axolotl's dataset hash, extended with everything POFE's preparation reads."""
    base = generate_dataset_hash_from_config(cfg, cfg.datasets, tokenizer.name_or_path)
    # the blocks as axolotl's cfg stores them (exclude_none), so the hash does not
    # depend on how the block was read and caches prepared before keep theirs
    blocks = pofe.model_dump(include={"generate", "judge", "candidates"}, exclude_none=True)
    extra = {
        "version": PREPARED_FORMAT_VERSION,
        "method": pofe.method,
        "fields": pofe.dataset_fields,
        "truncation": pofe.truncation,
        "max_prompt_len": pofe.max_prompt_len,
        "chat_template": tokenizer.chat_template,
        "generate": blocks.get("generate"),
        "judge": blocks.get("judge"),
        "candidates": blocks["candidates"],
        # axolotl's hash names the files; this is what they hold (edited in place)
        "data": local_files_digest(cfg.datasets),
    }
    payload = base + json.dumps(extra, sort_keys=True, default=str)
    return "pofe-" + hashlib.md5(payload.encode(), usedforsecurity=False).hexdigest()


def _load_or_prepare(cfg: DictDefault, pofe: PofeConfig, tokenizer, dataset_hash: str) -> Dataset:
    dataset = load_preprocessed_dataset(cfg, dataset_hash)
    if dataset is not None:
        return dataset
    dataset = _prepare(cfg, pofe, tokenizer)
    save_preprocessed_dataset(cfg, dataset, dataset_hash, "train")
    return dataset


def _prepare(cfg: DictDefault, pofe: PofeConfig, tokenizer) -> Dataset:
    max_prompt_len = pofe.max_prompt_len or cfg.sequence_len // 2
    if max_prompt_len >= cfg.sequence_len:
        raise ValueError(
            f"pofe.max_prompt_len ({max_prompt_len}) leaves no room for responses in "
            f"sequence_len ({cfg.sequence_len}); lower it"
        )
    parts = []
    for i, entry in enumerate(cfg.datasets):
        fields = pofe.dataset_fields[i] if i < len(pofe.dataset_fields) else {}
        fmt = RowFormat(dataset=entry.path, type=entry.type, method=pofe.method, fields=fields)
        raw = load_entry(entry, cfg.hf_use_auth_token)
        if entry.type == "pofe.prompts":
            raw, fmt = _candidates_from_prompts(cfg, pofe, entry, raw, fmt)
        check_columns(fmt, raw.column_names)
        part = raw.map(
            _prepare_row,
            with_indices=True,
            remove_columns=raw.column_names,
            fn_kwargs={
                "fmt": fmt,
                "tokenizer": tokenizer,
                "sequence_len": cfg.sequence_len,
                "max_prompt_len": max_prompt_len,
                "truncation": pofe.truncation,
            },
            desc=f"POFE: tokenising {entry.path}",
        )
        _log_length_policy(part, entry.path, pofe.truncation, cfg.sequence_len)
        part = part.filter(lambda keep: keep, input_columns="keep")
        if "rewards" in part.column_names:
            _warn_equal_rewards(part["rewards"], entry.path)
        parts.append(part)
    dataset = merge_datasets(parts, cfg)
    dataset = dataset.remove_columns(["keep", "truncated"])
    if len(dataset) == 0:
        raise ValueError(
            "no rows left to train on after the length policy; raise sequence_len or "
            "set pofe.truncation: truncate"
        )
    if method_spec(pofe.method).needs_anchor:
        dataset = _settle_anchor_column(dataset)
    return dataset


def _settle_anchor_column(dataset: Dataset) -> Dataset:
    """Keep given anchor log-probs only when every row has them; else mark rows for
    the trainer's one-off anchor pass (which then covers every row, so all log-ratios
    share one anchor)."""
    given = sum(a is not None for a in dataset["anchor_logps"])
    if given == len(dataset):
        return dataset
    if given:
        LOG.warning(
            f"POFE: {given} of {len(dataset)} rows carry anchor_logps; computing the "
            "anchor for all rows instead so every log-ratio uses the same anchor"
        )
    dataset = dataset.remove_columns("anchor_logps")
    return dataset.add_column("row_id", list(range(len(dataset))))


def _candidates_from_prompts(cfg: DictDefault, pofe: PofeConfig, entry, prompts: Dataset, fmt: RowFormat):
    """Generate and judge candidates for a prompt dataset; read them back as k-response rows."""
    result = build_candidates(cfg, pofe, entry, prompts, fmt.column("field_prompt"), prompt_format=fmt.prompt_format)
    rows = read_json_rows(result.data_path)
    # the pipeline writes each method's own row format: pofe.rrhf or pofe.sppo rows
    return rows, RowFormat(
        dataset=str(result.data_path), type=f"pofe.{fmt.method}", method=fmt.method, fields={}
    )


def build_candidates(
    cfg: DictDefault, pofe: PofeConfig, entry, prompts: Dataset, prompt_column: str, stop_after=None,
    prompt_format: str = "chat",
):
    """Run (or resume) the generate -> judge -> build pipeline for one prompt dataset.

    `pofe` is `cfg`'s validated `pofe:` block. `prompt_format` is the entry's (`hh`: the
    prompts and the dataset responses are HH transcripts, read as chat turns by
    `formats.prompt_row`).
    """
    from pofe.preprocess.pipeline import run_pipeline

    generate, judge, candidates = pofe.generate, pofe.judge, pofe.candidates.for_method(pofe.method)
    fmt = RowFormat(dataset=entry.path, type="pofe.prompts", method=pofe.method,
                    fields={"field_prompt": prompt_column, "prompt_format": prompt_format})
    # iterating decodes mixed-type (Json) columns; to_list() would give their JSON text
    rows = [prompt_row(row, i, fmt, generate.include_dataset_responses) for i, row in enumerate(prompts)]
    policy = sampling_policy(cfg, generate)
    # sampling from the policy that trains: render its prompts as training will (axolotl's
    # tokenizer, with the recipe's chat_template settings); generate.model keeps its own
    tokenizer = None if generate.model else load_tokenizer(cfg)
    if candidates.out_dir is None:
        # keyed on what the generate shards depend on: a changed judge reuses them (the
        # pipeline keeps each judge's shards apart inside)
        parts = [entry.path, entry.split, policy, prompt_column, generate.model_dump(), candidates.shard_size,
                 candidates.truncated, getattr(tokenizer, "chat_template", None)]
        # appended only when not the default, so caches built before the option keep their key
        parts += [prompt_format] if prompt_format != "chat" else []
        key = json.dumps(parts, sort_keys=True, default=str)
        digest = hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()
        out_dir = Path(cfg.dataset_prepared_path or "last_run_prepared") / f"pofe-candidates-{digest}"
        candidates = candidates.model_copy(update={"out_dir": str(out_dir)})
    result = run_pipeline(
        rows, policy_path=policy, method=pofe.method, generate=generate,
        judge=judge, candidates=candidates, prompt_column=prompt_column, stop_after=stop_after,
        tokenizer=tokenizer,
    )
    if result is None:
        LOG.info(f"POFE: stopped after the {stop_after} stage; shards in {candidates.out_dir}")
        return None
    s = result.summary
    LOG.info(
        f"POFE: {s['rows']} of {s['rows_in']} prompts of {entry.path} have candidates "
        f"(dropped: {s['rows_dropped'] or 0}), {s['candidates_per_prompt']['mean']:.2f} per "
        f"prompt, duplicates removed {s['duplicates_removed']}, empty candidates removed "
        f"{s['empty_candidates_removed']}, mean candidate reward "
        f"{s['mean_candidate_reward']}, best-of-k {s['mean_best_of_k_reward']}, judge "
        f"abstentions {s['judge_abstentions']}; summary in {result.summary_path}"
    )
    return result


def sampling_policy(cfg: DictDefault, generate) -> str:
    """What candidates are sampled from: `generate.model` when set, else the policy that
    trains. With an adapter loaded (`lora_model_dir`) that is base + adapter: SPPO's anchor
    is that iterate, so candidates drawn from the base alone would be off-policy."""
    if generate.model:
        return generate.model
    if not cfg.lora_model_dir:
        return cfg.base_model
    if generate.backend == "openai" and generate.serve is None:
        raise ValueError(
            f"lora_model_dir is set ({cfg.lora_model_dir}) but generate.backend: openai asks the "
            f"server for base_model by name, which would sample off-policy. Set generate.serve (POFE "
            f"then serves base + adapter as a LoRA module), or serve it yourself (`vllm serve "
            f"{cfg.base_model} --enable-lora --lora-modules policy={cfg.lora_model_dir}`) and set "
            "generate.model: policy"
        )
    # the transformers and vllm backends, and a served policy, load an adapter folder on its base
    return str(cfg.lora_model_dir)


def _prepare_row(row: dict[str, Any], index: int, *, fmt: RowFormat, tokenizer, **kw) -> dict:
    return tokenize_row(normalize_row(row, index, fmt), tokenizer, **kw)


def _log_length_policy(part: Dataset, path: str, truncation: str, sequence_len: int) -> None:
    over = sum(part["truncated"])
    if over:
        verb = "truncated" if truncation == "truncate" else "dropped"
        LOG.warning(
            f"POFE: {verb} {over} of {len(part)} rows of {path} longer than "
            f"sequence_len={sequence_len} (pofe.truncation: {truncation})"
        )


def _warn_equal_rewards(rewards: list[list[float]], path: str) -> int:
    """Count (and warn about) rows whose rewards are all equal: RRHF has no pair to rank
    there and only fine-tunes on the first response."""
    flat = sum(min(r) == max(r) for r in rewards)
    if flat:
        LOG.warning(
            f"POFE: {flat} of {len(rewards)} rows of {path} have all-equal rewards; RRHF "
            "learns no ranking from them, only SFT on their first response"
        )
    return flat


def _total_num_steps(cfg: DictDefault, num_rows: int) -> int:
    world = cfg.world_size or 1
    per_step = (cfg.micro_batch_size or 1) * (cfg.gradient_accumulation_steps or 1) * world
    steps = math.ceil(num_rows * (cfg.num_epochs or 1) / per_step)
    return min(steps, cfg.max_steps) if cfg.max_steps else steps
