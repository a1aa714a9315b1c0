"""What a plan reads from disk, never the network (`axolotl pofe plan`): the models' sizes
(`pofe.run.plan.model_size`), the prompt count, the policy tokenizer's BOS, the output_dir's free disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pofe.args import PofeConfig
from pofe.errors import PofeError
from pofe.files import read_jsonl
from pofe.paths import is_hub_id
from pofe.run.plan.estimate import GB, ModelSize
from pofe.run.plan.model_size import find_config, model_size, pairrm_backbone


class ModelNotFound(PofeError, ValueError):
    """The recipe's base_model is a local path with no model there: every stage of the run loads it."""


def not_found(model: str, key: str) -> str | None:
    """Why `model` (named by `key`), whose config.json is not on disk, is a local path that does
    not hold a model; None when it can be a hub id (one not in the cache: `_not_cached`)."""
    path = Path(model)
    if path.is_dir():
        return (
            f"{key}: the local directory {model} has no config.json: point {key} at the model's folder "
            "(the one holding config.json)"
        )
    if path.exists():
        return f"{key}: {model} is a file, not a model's folder: point {key} at the folder holding its config.json"
    if is_hub_id(model):
        return None
    where = (
        ""
        if path.is_absolute()
        else f" (as {path.resolve()}: a relative path counts from the directory the command runs in)"
    )
    return f"{key}: local path {model} not found{where}: correct {key}, or name a hub model id"


def _not_cached(model: str, key: str) -> str:
    return (
        f"{key}: {model} is not in the local cache (HF hub cache) and is not a local directory: it cannot be "
        "sized offline, nor told missing or gated (gated models need `hf auth login` and the model's "
        f"terms accepted). Fetch its config once: hf download {model} config.json"
    )


def size_of(model: str, kind: str, key: str) -> tuple[ModelSize | None, list[str]]:
    """`model`'s size, or None and a warning naming `key` when its config.json is not on disk."""
    config = find_config(model)
    if config is None:
        return None, [not_found(model, key) or _not_cached(model, key)]
    if kind == "encoder" and (backbone := pairrm_backbone(config)):
        key = f"{key} (PairRM's backbone, model_name in its config.json)"
        config = find_config(backbone)
        if config is None:
            return None, [not_found(backbone, key) or _not_cached(backbone, key)]
    return model_size(config, kind), []


def model_sizes(raw: dict, pcfg: PofeConfig) -> tuple[dict[str, ModelSize | None], list[str]]:
    """The sizes of the policy and the judges (model id -> size), and what could not be sized.

    A base_model that is a local path with no model there raises `ModelNotFound`: the run could
    not start, so there is nothing to plan. A judge's is a warning, as a model not in the hub
    cache is: the plan of the other stages still holds."""
    base = str(raw["base_model"])
    if find_config(base) is None and (why := not_found(base, "base_model")):
        raise ModelNotFound(why)
    wanted = [(base, "causal_lm", "base_model")]
    judges = [("pofe.judge.model", pcfg.judge)]
    if pcfg.eval and pcfg.eval.judge2 is not None:
        judges.append(("pofe.eval.judge2.model", pcfg.eval.judge2))
    wanted += [(j.model, j.spec.model_kind, key) for key, j in judges if j.spec.loads_weights and j.model]
    sizes, warnings = {}, []
    for model, kind, key in wanted:
        if model not in sizes:
            sizes[model], said = size_of(model, kind, key)
            warnings += said
    return sizes, warnings


def prompt_rows(raw: dict, columns: list[str]) -> tuple[int | None, list[int] | None]:
    """(rows, each row's dataset responses) of the pofe.prompts dataset when it is a local file
    (JSON, JSONL or Parquet), else (None, None). A row's responses are those of its `columns`
    (`generate.include_dataset_responses`) as the candidates stage takes them (`column_texts`:
    a string is one, a list its length, none or null none); None without columns."""
    (entry, *_) = raw.get("datasets") or [{}]
    path = Path(str(entry.get("path", "")))
    if not path.is_file():
        return None, None
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        if not columns:
            return table.metadata.num_rows, None
        rows = table.read(columns=[c for c in columns if c in table.schema_arrow.names]).to_pylist()
    elif path.suffix == ".jsonl":
        if not columns:
            with path.open(encoding="utf-8") as f:
                return sum(1 for line in f if line.strip()), None
        rows = read_jsonl(path)  # a broken line: UnreadableFile naming it
    else:
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            return None, None
        if not columns:
            return len(rows), None
    from pofe_candidates.shard_work import column_texts

    try:
        return len(rows), [sum(len(column_texts(row, c, i)) for c in columns) for i, row in enumerate(rows)]
    except TypeError as e:  # the candidates stage stops on this row too
        raise ValueError(f"{path}: {e}") from None


def double_bos(model: str) -> str | None:
    """A warning when the policy's tokenizer, given its chat template's text, starts with two BOS:
    the template writes one and `add_special_tokens=True` (how vLLM and servers tokenize text by
    default) adds another. None when the tokenizer is fine, has no template, or is not on disk."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError):
        return None
    if tok.bos_token_id is None or not getattr(tok, "chat_template", None):
        return None
    text = tok.apply_chat_template([{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=True).input_ids
    if ids[:2] != [tok.bos_token_id] * 2:
        return None
    return (
        f"base_model: {model}'s chat template writes BOS ({tok.bos_token!r}) and its tokenizer adds one: "
        "text sent to a backend that tokenizes with add_special_tokens=True (vLLM, /v1/completions) starts "
        "with two BOS. Send token ids (pofe.generate.backend: vllm, in process), or a server that takes "
        "add_special_tokens: false"
    )


def free_disk(output_dir: str) -> float:
    """Free bytes on the filesystem output_dir will be on (its nearest existing parent)."""
    path = Path(output_dir).resolve()
    while not path.exists():
        path = path.parent
    return float(shutil.disk_usage(path).free)


def disk_warning(plan: dict, free: float) -> list[str]:
    need = plan["disk_gb"]
    if need is None or need * GB <= free:
        return []
    return [
        f"the run writes about {need} GB under output_dir ({plan['recipe']}), more than the {free / GB:.1f} GB "
        "free there: lower save_total_limit (axolotl keeps 4 checkpoints when it is unset; save_only_model for "
        "ZeRO-3), or use another output_dir"
    ]
