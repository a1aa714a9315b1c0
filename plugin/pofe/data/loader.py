"""`load_datasets` for POFE: k-response rows in, tokenised rows cached on disk out.

Loading, hashing, caching under `dataset_prepared_path`, the rank lock and the
train/validation split are axolotl's own helpers; POFE adds the row checks
(`formats.py`) and the prompt/response tokenisation (`tokenize.py`). A `pofe.prompts`
entry's rows come from the candidate pipeline (`candidates.py`).
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any

from axolotl.common.datasets import TrainDatasetMeta
from axolotl.loaders import load_tokenizer
from axolotl.utils.dict import DictDefault
from datasets import Dataset

from pofe.args import PofeConfig
from pofe.columns import ANCHOR_LOGPS, AS_TEXT, SPLIT_IN_WORD
from pofe.compat.axolotl_datasets import (
    axolotl_dataset_hash,
    load_prepared,
    load_under_lock,
    merge_entries,
    prepared_path,
    save_prepared,
    split_validation,
)
from pofe.data.candidates import candidates_from_prompts
from pofe.data.debug_rows import show_rows, show_splits
from pofe.data.formats import (
    RowFormat,
    candidate_row,
    check_columns,
    implicit_prompt_note,
    normalize_row,
    ordered_label_columns,
    template_refused,
)
from pofe.data.held_out import SOURCE_PROMPT, held_out_count, hold_out
from pofe.data.label_checks import conflicting_rows, reversed_pair_rows, shown, text_keys
from pofe.data.sources import load_entry, local_files_digest
from pofe.data.tokenize import (
    EOS_APPENDED,
    PROMPT_TOKEN_MERGED,
    check_stop_token,
    eos_appended_note,
    text_rows_notes,
    tokenize_row,
)
from pofe.files import stable_hash, write_atomic
from pofe.length_policy import entry_summary, no_rows_message, summary_message
from pofe.logs import get_logger
from pofe.methods import MethodSpec, method_spec
from pofe_candidates.render import ChatTemplateError

LOG = get_logger(__name__)
# the prompt formats whose rows are always rendered with the chat template
CHAT = ("chat", "hh")

# Bump when the prepared row layout changes, so stale caches are not reused.
# 2: sampled response ids trained as they are; 3: whole turns cut; 4: a row_id on every anchored row;
# 5: each row's source_prompt; 6: eos_token ends each response of a template that writes no stop token;
# 7: text rows trained as text (TRL's standard layout)
PREPARED_FORMAT_VERSION = 7
# the length policy's record of each tokenised row (`tokenize.tokenize_row`)
POLICY_COLUMNS = ["truncated", "drop_reason", "turns_cut", "responses_cut"]
# what a tokenised row tells the loader's warnings, then dropped
NOTE_COLUMNS = [EOS_APPENDED, AS_TEXT, SPLIT_IN_WORD, PROMPT_TOKEN_MERGED, "prompt_key", "response_keys"]


def load_pofe_datasets(
    cfg: DictDefault, pofe: PofeConfig, preprocess: bool = False, debug: tuple[int, bool] = (0, False)
) -> TrainDatasetMeta:
    """Build (or reuse) the tokenised k-response dataset described by `cfg`.

    `pofe` is `cfg`'s validated `pofe:` block, read once by the plugin's hook and passed down.
    `debug`: (rows, text only) to show, from axolotl's `--debug` flags (`debug_rows`).
    """
    tokenizer = load_tokenizer(cfg)
    if getattr(tokenizer, "chat_template", None):
        check_stop_token(tokenizer)  # before any candidate is sampled for a response that could not end
    elif chat := [e.path for i, e in enumerate(cfg.datasets) if RowFormat.of_entry(e, i, pofe).prompt_format in CHAT]:
        raise ValueError(
            f"the tokenizer of {cfg.tokenizer_config or cfg.base_model} has no chat template, and "
            f"{', '.join(chat)} render prompts and responses with one: set `chat_template:` (e.g. chatml) in the "
            "recipe (a dataset of text rows trains without one: `prompt_format: text` on its entry)"
        )
    dataset_hash = prepared_dataset_hash(cfg, pofe, tokenizer)
    Path(cfg.dataset_prepared_path or "last_run_prepared").mkdir(parents=True, exist_ok=True)
    dataset = load_under_lock(cfg, partial(_load_or_prepare, cfg, pofe, tokenizer, dataset_hash))

    if debug[0]:
        show_splits(cfg, pofe, debug[0])
        show_rows(dataset, tokenizer, pofe.method, *debug)
    eval_dataset = None
    if cfg.val_set_size:
        dataset, eval_dataset = split_validation(dataset, cfg)
    return TrainDatasetMeta(
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        total_num_steps=total_num_steps(cfg, len(dataset)),
    )


def prepared_dataset_hash(cfg: DictDefault, pofe: PofeConfig, tokenizer) -> str:
    """Axolotl's dataset hash, extended with everything POFE's preparation reads."""
    from pofe_candidates.identity import judge_identity

    base = axolotl_dataset_hash(cfg, tokenizer.name_or_path)
    # the settings as resolved, defaults filled in as preparation fills them (per method, per
    # judge): two recipes that prepare differently never share a cache, and two that state one
    # default differently (`dedupe: true` under RRHF, or left out) share one
    method = pofe.method
    extra = {
        "version": PREPARED_FORMAT_VERSION,
        "method": method,
        "fields": pofe.dataset_fields,
        "truncation": pofe.truncation,
        "max_prompt_len": pofe.max_prompt_len or cfg.sequence_len // 2,
        "chat_template": tokenizer.chat_template,
        "generate": pofe.generate.for_method(method).model_dump() if pofe.generate else None,
        "judge": pofe.judge.model_dump() if pofe.judge else None,
        # the judge's code or weights: an edited judge function judges the candidates again
        "judge_identity": judge_identity(pofe.judge) if pofe.judge else None,
        "candidates": pofe.candidates.for_method(method).model_dump(),
        # `pofe.eval.held_out`: the rows kept from training (`held_out.py`)
        "held_out": held_out_count(pofe, cfg.datasets),
        # axolotl's hash names the files; this is what they hold (edited in place)
        "data": local_files_digest(cfg.datasets),
    }
    return "pofe-" + stable_hash([base, extra], 32)


def _load_or_prepare(cfg: DictDefault, pofe: PofeConfig, tokenizer, dataset_hash: str) -> Dataset:
    dataset = load_prepared(cfg, dataset_hash)
    if dataset is not None:
        return dataset
    prepared = Path(cfg.dataset_prepared_path or "last_run_prepared")
    dataset = _prepare(cfg, pofe, tokenizer, prepared / f"length-policy-{dataset_hash}.json")
    _store_prepared(cfg, dataset, dataset_hash)
    return dataset


def _store_prepared(cfg: DictDefault, dataset: Dataset, dataset_hash: str) -> None:
    """axolotl's `save_preprocessed_dataset`, in this process where axolotl would use one
    worker (under 2 x 256 rows, its rows per worker): `save_to_disk(num_proc=1)` runs in a
    spawned pool of one, a fresh interpreter per save (3.3 s to save 8 rows, against 0.0 s
    in process, on a loaded 2-core machine)."""
    if len(dataset) >= 2 * 256 or cfg.push_dataset_to_hub:
        save_prepared(cfg, dataset, dataset_hash)
        return
    path = prepared_path(cfg, dataset_hash)
    path.mkdir(parents=True, exist_ok=True)
    dataset.save_to_disk(str(path), max_shard_size=None, num_shards=cfg.num_dataset_shards_to_save)


def _prepare(cfg: DictDefault, pofe: PofeConfig, tokenizer, policy_path: Path | None = None) -> Dataset:
    """The tokenised rows of every entry; `policy_path`: where the length policy's per-row
    record goes when it touched any row (`length_policy.entry_summary`)."""
    max_prompt_len = pofe.max_prompt_len or cfg.sequence_len // 2
    if max_prompt_len >= cfg.sequence_len:
        raise ValueError(
            f"pofe.max_prompt_len ({max_prompt_len}) leaves no room for responses in "
            f"sequence_len ({cfg.sequence_len}); lower it"
        )
    spec = method_spec(pofe.method)
    held = held_out_count(pofe, cfg.datasets)
    parts, policy = [], []
    for i, entry in enumerate(cfg.datasets):
        fmt = RowFormat.of_entry(entry, i, pofe)
        part, summary = _prepare_entry(cfg, pofe, fmt, entry, tokenizer, max_prompt_len, held)
        policy.append(summary)
        if summary["rows_over_sequence_len"]:
            where = f"; per row in {policy_path}" if policy_path else ""
            LOG.warning(summary_message(summary, cfg.sequence_len, pofe.truncation) + where)
        if spec.equal_labels_note:
            _warn_equal_labels(part[spec.target.column], entry.path, spec)
        parts.append(part)
    dataset = merge_entries(parts, cfg)
    if appended := sum(dataset[EOS_APPENDED]):
        LOG.warning(eos_appended_note(tokenizer, appended, sum(n > 0 for n in dataset[EOS_APPENDED])))
    dataset = dataset.remove_columns(["keep", *POLICY_COLUMNS, *NOTE_COLUMNS])
    if policy_path is not None and any(p["rows_over_sequence_len"] for p in policy):
        record = {"sequence_len": cfg.sequence_len, "max_prompt_len": max_prompt_len, "truncation": pofe.truncation}
        write_atomic(policy_path, json.dumps({**record, "datasets": policy}, indent=2) + "\n")
    if len(dataset) == 0:
        raise ValueError(no_rows_message(policy, cfg.sequence_len, max_prompt_len, pofe.truncation))
    if spec.needs_anchor:
        dataset = _settle_anchor_column(dataset)
    return dataset


def _prepare_entry(
    cfg: DictDefault, pofe: PofeConfig, fmt: RowFormat, entry, tokenizer, max_prompt_len: int, held: int
) -> tuple[Dataset, dict]:
    """One entry's tokenised rows (those the length policy keeps, none with a held-out prompt)
    and the length policy's summary of them."""
    spec = method_spec(pofe.method)
    raw = load_entry(entry, cfg.hf_use_auth_token)
    held_keys: set[str] = set()
    if held:  # `pofe.eval.held_out`: the last rows are for `axolotl pofe eval` (`held_out.py`)
        raw, _, held_keys = hold_out(raw, fmt, held)
    if entry.type == "pofe.prompts":
        # the pipeline's own rows are canonical already: shaped, not checked again
        raw, source = candidates_from_prompts(cfg, pofe, entry, raw, fmt)
        canonical = partial(candidate_row, target=spec.target, source=source)
        fields = (source, {"prompt": "prompt", "responses": "responses"})
    else:
        check_columns(fmt, raw.column_names)
        if note := implicit_prompt_note(fmt, raw.column_names):
            LOG.info(note)
        canonical = partial(normalize_row, fmt=fmt)
        fields = (fmt.dataset, {"prompt": fmt.column("field_prompt"), "responses": "/".join(fmt.response_columns())})
    part = raw.map(
        _prepare_row,
        with_indices=True,
        remove_columns=raw.column_names,
        fn_kwargs={
            "canonical": canonical,
            "fields": fields,
            "tokenizer": tokenizer,
            "sequence_len": cfg.sequence_len,
            "max_prompt_len": max_prompt_len,
            "truncation": pofe.truncation,
        },
        desc=f"POFE: tokenising {entry.path}",
    )
    info, warning = text_rows_notes(fmt.dataset, part[AS_TEXT], part[SPLIT_IN_WORD], part[PROMPT_TOKEN_MERGED])
    for log, note in ((LOG.info, info), (LOG.warning, warning)):
        if note:
            log(note)
    summary = entry_summary(entry.path, part.select_columns(POLICY_COLUMNS).to_dict())
    if summary["rows_over_sequence_len"] and entry.type == "pofe.prompts":
        _record_in_summary(Path(source).parent / "summary.json", summary, cfg.sequence_len, pofe.truncation)
    _warn_suspicious_labels(part, fmt, spec.target.column, ordered_label_columns(fmt, raw.column_names))
    part = part.filter(lambda keep: keep, input_columns="keep")
    if held:
        part = _without_held_out_prompts(part, held_keys, held, fmt)
    return part, summary


def _without_held_out_prompts(part: Dataset, keys: set[str], held: int, fmt: RowFormat) -> Dataset:
    """The rows whose prompt is none of the held-out rows' (`keys`), the others counted."""
    kept = part.filter(lambda key: key not in keys, input_columns="prompt_key")
    LOG.info(
        f"POFE: the last {held} rows of {fmt.dataset} are held out for `axolotl pofe eval` (pofe.eval.held_out)"
        + (f", and {len(part) - len(kept)} other rows with their prompts" if len(kept) < len(part) else "")
        + f"; training on {len(kept)} rows"
    )
    return kept


def _record_in_summary(summary_path: Path, entry: dict, sequence_len: int, truncation: str) -> None:
    """The length policy's counts and per-row record (rows of data.jsonl) in the candidates'
    summary.json as well, which travels with them (the hub's dataset repo), under `length_policy`."""
    if not summary_path.exists():
        return
    summary = json.loads(summary_path.read_text())
    summary["length_policy"] = {
        "sequence_len": sequence_len,
        "truncation": truncation,
        **{k: v for k, v in entry.items() if k != "dataset"},
    }
    write_atomic(summary_path, json.dumps(summary, indent=2, sort_keys=True) + "\n", private=True)


def _settle_anchor_column(dataset: Dataset) -> Dataset:
    """Keep given anchor log-probs only when every row has them; else the trainer's one-off
    anchor pass covers every row, so all log-ratios share one anchor. Every row gets its
    `row_id`, which the anchor's and pi_0's tables are indexed by (`pofe.anchor`): pi_0's
    table (`pofe.anchor_mix`) is computed whether the anchors are given or not."""
    given = sum(a is not None for a in dataset[ANCHOR_LOGPS]) if ANCHOR_LOGPS in dataset.column_names else 0
    if given == len(dataset):
        return dataset.add_column("row_id", list(range(len(dataset))))
    if given:
        LOG.warning(
            f"POFE: {given} of {len(dataset)} rows carry anchor_logps; computing the "
            "anchor for all rows instead so every log-ratio uses the same anchor"
        )
    if ANCHOR_LOGPS in dataset.column_names:
        dataset = dataset.remove_columns(ANCHOR_LOGPS)
    return dataset.add_column("row_id", list(range(len(dataset))))


def _prepare_row(
    row: dict[str, Any], index: int, *, canonical, fields: tuple[str, dict[str, str]], tokenizer, **kw
) -> dict:
    """One row canonical and tokenised. `fields`: the dataset, and the column each canonical
    field ("prompt", "responses") came from, for errors."""
    row = canonical(row, index)
    # the prompt as a judge reads it, for `axolotl pofe eval` of the rows axolotl keeps from
    # training (val_set_size): JSON, one column type for text and chat messages
    source = json.dumps(row["source_prompt"], sort_keys=True)
    try:
        tokenized = tokenize_row(row, tokenizer, **kw)
    except ChatTemplateError as e:
        dataset, columns = fields
        raise template_refused(dataset, index, columns[e.field], tokenizer.name_or_path, e.message) from e
    flags = {AS_TEXT: bool(row.get(AS_TEXT)), SPLIT_IN_WORD: bool(row.get(SPLIT_IN_WORD))}
    return {**tokenized, **text_keys(row), **flags, SOURCE_PROMPT: source}


def _warn_suspicious_labels(
    part: Dataset, fmt: RowFormat, column: str, ordered: list[str] | None = None
) -> tuple[int, int]:
    """Warn about (and count) rows whose labels contradict another row's for the same prompt,
    and pairs whose chosen response has the lower label (`label_checks.py`). `ordered`: the
    two columns a pair's labels come from when they say which is better (`sppo_ucla`'s win
    rates, TRL's scores), else None. Rows are the entry's, 0-based, before the length policy
    drops any."""
    labels = part[column]
    conflicts = conflicting_rows(part["prompt_key"], part["response_keys"], labels)
    if conflicts:
        LOG.warning(
            f"POFE: {len(conflicts)} of {len(part)} rows of {fmt.dataset} rank two responses of a prompt in the "
            f"opposite order to an earlier row with the same prompt (rows {shown(conflicts)}); training pulls "
            "both ways: remove or merge the duplicates"
        )
    reversed_rows = reversed_pair_rows(labels) if ordered else []
    if reversed_rows:
        LOG.warning(
            f"POFE: {len(reversed_rows)} of {len(part)} rows of {fmt.dataset} have {ordered[0]} < {ordered[1]} "
            f"(rows {shown(reversed_rows)}): their chosen response has the lower label, which a preference "
            "dataset does not mean; training takes the labels as given. Check that the columns are not swapped"
        )
    return len(conflicts), len(reversed_rows)


def _warn_equal_labels(labels: list[list[float]], path: str, spec: MethodSpec) -> int:
    """Count (and warn about) rows whose labels are all equal, saying what the method
    learns from them (`MethodSpec.equal_labels_note`)."""
    flat = sum(min(r) == max(r) for r in labels)
    if flat:
        LOG.warning(
            f"POFE: {flat} of {len(labels)} rows of {path} have all-equal {spec.target.noun}; {spec.equal_labels_note}"
        )
    return flat


def total_num_steps(cfg: DictDefault, num_rows: int) -> int:
    world = cfg.world_size or 1
    per_step = (cfg.micro_batch_size or 1) * (cfg.gradient_accumulation_steps or 1) * world
    steps = math.ceil(num_rows * (cfg.num_epochs or 1) / per_step)
    return min(steps, cfg.max_steps) if cfg.max_steps else steps
