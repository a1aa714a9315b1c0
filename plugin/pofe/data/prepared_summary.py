"""The lines `axolotl preprocess` of a POFE recipe ends its console with.

Axolotl's preprocess ends with its own "Success! Preprocessed data path" line, and no hook runs
after it: `pofe.PofePlugin` logs these lines at the process's exit, so the console ends with
POFE's verdict (as `pofe.training_log`'s ends `axolotl train`'s): the rows prepared, their
candidates per prompt and where they are; for each prompt dataset, the candidates' folder,
the prompts kept and dropped, the judge's verdicts and abstentions; the length policy's drops;
the labels' mean (rewards: mean and best-of-k; win rates: the best's and the spread); and the
command that trains on them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from axolotl.loaders import load_tokenizer

from pofe.compat.axolotl_datasets import prepared_path
from pofe.data.candidates import candidates_folder
from pofe.data.formats import RowFormat
from pofe.data.held_out import held_out_count
from pofe.data.loader import prepared_dataset_hash
from pofe.length_policy import summary_message
from pofe.methods import method_spec
from pofe.training_log import LOCK_FD_ENV
from pofe_candidates.win_rates import nan_mean


def preprocess_summary(cfg, pofe, meta) -> list[str]:
    """The verdict of `axolotl preprocess` on an offline POFE recipe. `cfg`: axolotl's validated
    config; `pofe`: its `pofe:` block; `meta`: the TrainDatasetMeta the loader returned."""
    target = method_spec(pofe.method).target
    train, held = meta.train_dataset, meta.eval_dataset
    labels = train[target.column]
    k = [len(row) for row in labels]
    tokenizer = load_tokenizer(cfg)
    where = prepared_path(cfg, prepared_dataset_hash(cfg, pofe, tokenizer))
    per_prompt = f"{min(k)}" if min(k) == max(k) else f"{sum(k) / len(k):.2f} (min {min(k)}, max {max(k)})"
    kept = []
    if held is not None:
        kept.append(f"{len(held)} more for validation (val_set_size)")
    if n := held_out_count(pofe, cfg.datasets):
        kept.append(f"the last {n} rows of {cfg.datasets[0].path} held out for `axolotl pofe eval`")
    lines = [
        f"POFE: prepared {len(train)} rows for rl: {pofe.method}, {per_prompt} candidates per prompt, in {where}"
        + (f"; {', '.join(kept)}" if kept else "")
    ]
    for i, entry in enumerate(cfg.datasets):
        if entry.type == "pofe.prompts":
            fmt = RowFormat.of_entry(entry, i, pofe)
            folder = candidates_folder(cfg, pofe, entry, fmt.column("field_prompt"), fmt.prompt_format)
            lines.append(_candidates_line(entry.path, folder))
    lines += _length_policy_lines(where.parent / f"length-policy-{where.name}.json", pofe)
    if target.from_win_rates:
        best, spread = nan_mean([max(r) for r in labels]), nan_mean([max(r) - min(r) for r in labels])
        lines.append(
            f"POFE: win rates of the prepared candidates: the best's {best:.3f} on average, spread {spread:.3f}"
        )
    else:
        mean, best = nan_mean([x for r in labels for x in r]), nan_mean([max(r) for r in labels])
        lines.append(f"POFE: rewards of the prepared candidates: mean {mean:.3f}, best-of-k {best:.3f}")
    return lines + _next(cfg)


def online_preprocess_summary(cfg, meta) -> list[str]:
    """The verdict of `axolotl preprocess` on an online recipe, whose candidates are sampled as it trains."""
    return [
        f"POFE: {len(meta.train_dataset)} prompts checked; nothing to prepare ahead: an online recipe samples its "
        "candidates from the policy as it trains",
        *_next(cfg),
    ]


def _next(cfg) -> list[str]:
    """The command that trains on what preprocess made (none in a round of `axolotl pofe run`, which trains next)."""
    return [] if os.environ.get(LOCK_FD_ENV) else [f"POFE: next, train: axolotl train {cfg.axolotl_config_path}"]


def _candidates_line(path: str, folder: Path) -> str:
    """A prompt dataset's candidates: their folder, the prompts kept and dropped, the judge's
    verdicts and abstentions (its summary.json)."""
    s = json.loads((folder / "summary.json").read_text())
    dropped = ", ".join(f"{reason} {n}" for reason, n in s["rows_dropped"].items()) or "none"
    abstained = ""
    if s.get("judge_abstentions"):
        reasons = ", ".join(f"{kind} {n}" for kind, n in s["judge_abstention_reasons"].items())
        abstained = f" ({reasons})"
    # a summary.json from before POFE counted the verdicts has the abstentions alone
    verdicts = f"gave {s['judge_verdicts']} verdicts and " if "judge_verdicts" in s else ""
    return (
        f"POFE: {path}: {s['rows']} of {s['rows_in']} prompts have candidates (dropped: {dropped}); the judge "
        f"{verdicts}abstained on {s['judge_abstentions']}{abstained}; in {folder}"
    )


def _length_policy_lines(path: Path, pofe) -> list[str]:
    """The length policy's line for each entry it touched (`path`: the loader's record, written
    when it cut or dropped any row)."""
    if not path.is_file():
        return []
    record = json.loads(path.read_text())
    return [
        summary_message(entry, record["sequence_len"], pofe.truncation)
        for entry in record["datasets"]
        if entry["rows_over_sequence_len"]
    ]
