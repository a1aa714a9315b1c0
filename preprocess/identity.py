"""What a judge's verdicts depend on beyond its settings: its code, or its weights.

`judge/manifest.json` keys the judge shards (`manifest.py`); with these in it, a python judge
whose module was edited, or a reward model whose weights changed, judges again instead of
its old rewards being reused.

- Python judges (`judge.function`, `judge.reward_funcs`): the sha256 of each function's
  module file, found without importing it. An edit to another module that one imports is
  not seen.
- Reward models and PairRM (`judge.model`): a local folder or file by its files' names and
  contents, each file over `CONTENT_HASH_CAP` bytes by its size and modification time
  instead (hashing gigabytes of weights at every start would cost minutes; rewriting a
  file, even unchanged, then counts as a change). A hub id by the commit its local cache
  resolves to (`main`), or "not cached" before its first download.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pofe.files import file_sha256, stable_hash
from pofe.preprocess.config import FUNCTION_JUDGES, JudgeConfig

CONTENT_HASH_CAP = 64 * 2**20
WEIGHTED_JUDGES = ("reward_model", "pairrm")


def module_digest(module_name: str) -> str:
    """sha256 of the module's source file; "not found" (the judge's import then says why)."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    digest = file_sha256(Path(origin)) if origin else None
    return digest or "not found"


def function_module(spec: str) -> str:
    """'module:function' or 'package.module.function' -> the module's name."""
    return spec.partition(":")[0] if ":" in spec else spec.rpartition(".")[0]


def weights_digest(model: str) -> str:
    """The identity of a reward model's weights (see the module's docstring)."""
    path = Path(model)
    if path.exists():
        root = path if path.is_dir() else path.parent
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return stable_hash(
            [
                [
                    str(p.relative_to(root)),
                    file_sha256(p)
                    if p.stat().st_size <= CONTENT_HASH_CAP
                    else [p.stat().st_size, p.stat().st_mtime_ns],
                ]
                for p in files
            ]
        )
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(model, "config.json")
    return f"commit {Path(cached).parent.name}" if isinstance(cached, str) else "not cached"


def judge_identity(judge: JudgeConfig) -> dict[str, str]:
    """{function or model: digest} for the judge's code or weights; {} for an LLM judge (a
    server's model, known by name only)."""
    if judge.type in FUNCTION_JUDGES:
        return {spec: module_digest(function_module(spec)) for spec in (judge.reward_funcs or [judge.function])}
    if judge.type in WEIGHTED_JUDGES:
        return {judge.model: weights_digest(judge.model)}
    return {}
