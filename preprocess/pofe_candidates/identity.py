"""What a judge's verdicts depend on beyond its settings: its code, or its weights.

`judge/manifest.json` keys the judge shards (`manifest.py`); with these in it, a python judge
whose module was edited, or a reward model whose weights changed, judges again instead of
its old rewards being reused.

- Python judges (`judge.function`, `judge.reward_funcs`): the sha256 of each function's
  module file, found without importing it. An edit to another module that one imports is
  not seen.
- Judges that load weights (reward models, PairRM, GPM: `judge.model`):
  `pofe.files.weights_fingerprint`, the one identity of a model's weights (a local folder by
  its files, a hub id by its cached commit).

Which a judge is, its type's spec says (`JudgeSpec.source`).
"""

from __future__ import annotations

from pathlib import Path

from pofe.files import file_sha256, weights_fingerprint
from pofe.recipe_modules import find_recipe_module
from pofe_candidates.config import JudgeConfig


def module_digest(module_name: str) -> str:
    """sha256 of the module's source file, found where the judge imports it from (beside the
    recipe too: `pofe.recipe_modules`); "not found" (the judge's import then says why)."""
    try:
        spec = find_recipe_module(module_name)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None)
    digest = file_sha256(Path(origin)) if origin else None
    return digest or "not found"


def function_module(spec: str) -> str:
    """'module:function' or 'package.module.function' -> the module's name."""
    return spec.partition(":")[0] if ":" in spec else spec.rpartition(".")[0]


def judge_identity(judge: JudgeConfig) -> dict[str, str]:
    """{function or model: digest} for the judge's code or weights; {} for an LLM judge (a
    server's model, known by name only)."""
    if judge.spec.calls_functions:
        return {spec: module_digest(function_module(spec)) for spec in (judge.reward_funcs or [judge.function])}
    if judge.spec.loads_weights:
        return {judge.model: weights_fingerprint(judge.model)}
    return {}
