"""pi_0's log-probs of every candidate, for SPPO's anchor mixed toward pi_0 (`pofe.anchor_mix`).

pi_0 is the run's first policy: `pofe.pi_0` when set, else the recipe's `base_model`.
Which pass gives its log-probs (`pi_0_route`):

- "policy": pi_0 is the policy this training starts from (no adapter loaded, or
  `pi_0` names the loaded adapter): its table is the policy's own pass before the
  first update, the anchor table's (`pofe.anchor.AnchorLogps`). Round 1 of an iterated run;
  offline, the mixed anchor then equals the anchor (the trainer says so).
- "adapter": the policy is a LoRA/QLoRA adapter loaded on pi_0 (`lora_model_dir` on
  `base_model` = pi_0): one more no-grad pass of the policy with its adapter disabled, in the
  trainer's first step beside the anchor pass. No second model loads.
- "apart": pi_0 is another model (rounds 2..T of an iterated run, whose `base_model` is the
  merged pi_{t-1}; or an SFT model `pi_0` names): loaded on its own when the rows load
  (`prepare_pi_0_table`, from the plugin's `load_datasets` hook, in `axolotl preprocess` and
  `axolotl train` alike), scored, and freed before the policy loads: one model in memory at a
  time. In the recipe's dtype, and in 4-bit (8-bit) when the recipe loads the policy so.

Every route caches its table like the anchor's (`pofe.anchor.table`), keyed on pi_0's
weights (`pofe.files.weights_fingerprint`), the route and the rows. pi_0 never trains, so its
table can be computed again at any step (a resumed run included).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch
from filelock import FileLock

from pofe.anchor.table import RowScorer, cached_table, checked_table, save_table, score_rows, table_path
from pofe.files import weights_fingerprint
from pofe.logs import get_logger

LOG = get_logger(__name__)

Pi0Route = Literal["policy", "adapter", "apart"]
WHAT = "pi_0"
REDO = "the next run computes pi_0's log-probs again (pi_0 does not change as the policy trains)."


def _same_model(a: str, b: str | None) -> bool:
    """Whether two model names point at one model: the same folder on disk, else the same hub id."""
    if b is None:
        return False
    path_a, path_b = Path(str(a)), Path(str(b))
    if path_a.exists() and path_b.exists():
        return path_a.resolve() == path_b.resolve()
    return str(a) == str(b)


def pi_0_name(cfg, pi_0: str | None) -> str:
    """pi_0's name: `pi_0` (`pofe.pi_0`), else the recipe's base_model."""
    return str(pi_0 or cfg.base_model)


def pi_0_route(cfg, pi_0: str | None) -> Pi0Route:
    """Which pass gives pi_0's log-probs for a recipe (`cfg`: base_model, lora_model_dir)."""
    if cfg.lora_model_dir:  # the policy is base_model + a loaded adapter
        if pi_0 is None or _same_model(pi_0, cfg.base_model):
            return "adapter"
        return "policy" if _same_model(pi_0, cfg.lora_model_dir) else "apart"
    return "policy" if pi_0 is None or _same_model(pi_0, cfg.base_model) else "apart"


def pi_0_table_path(cfg, pi_0: str | None, route: Pi0Route, datasets) -> Path:
    """Where pi_0's table for these rows is cached (`route` "adapter" or "apart")."""
    name = pi_0_name(cfg, pi_0)
    revision = cfg.revision_of_model if _same_model(name, cfg.base_model) else None
    return table_path(cfg, datasets, WHAT, [weights_fingerprint(name, revision)], route=route)


@contextmanager
def adapter_disabled(model):
    """`model` (a PEFT model, unwrapped from accelerate's wrappers) with its adapters off."""
    if not hasattr(model, "disable_adapter"):
        raise TypeError(
            f"pofe.anchor_mix: the policy ({type(model).__name__}) carries no PEFT adapter to disable, "
            "though lora_model_dir is set; set pofe.pi_0 to pi_0's folder to load it apart"
        )
    with model.disable_adapter():
        yield model


def recipe_dtype(cfg) -> torch.dtype:
    """The float dtype a recipe trains in (bf16 / fp16 / float32)."""
    if cfg.bf16 is True or str(cfg.torch_dtype) in ("bfloat16", "torch.bfloat16"):
        return torch.bfloat16
    if cfg.fp16 is True or str(cfg.torch_dtype) in ("float16", "torch.float16"):
        return torch.float16
    return torch.float32


def _quantization(cfg, dtype: torch.dtype):
    """A BitsAndBytesConfig like the policy's when the recipe loads it in 4 or 8 bits, else None."""
    if not (cfg.load_in_4bit or cfg.load_in_8bit):
        return None
    from transformers import BitsAndBytesConfig

    if cfg.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )


def compute_apart(cfg, pi_0: str, datasets, scorer: RowScorer) -> torch.Tensor:
    """pi_0 (the model `pi_0` names) loaded on its own, every row scored on this process, then freed."""
    from pofe_candidates.models import load_policy

    dtype = recipe_dtype(cfg)
    LOG.info(f"POFE: loading pi_0 ({pi_0}) for its log-probs of the candidates (pofe.anchor_mix)")
    model = load_policy(pi_0, device=scorer.device, dtype=dtype, quantization=_quantization(cfg, dtype))
    try:
        return checked_table(score_rows(model, datasets, scorer, WHAT, ranks=(0, 1)), datasets, pi_0, WHAT)
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def prepare_pi_0_table(cfg, pi_0: str | None, datasets, scorer: RowScorer) -> Path | None:
    """pi_0's table for the route "apart", computed (or found) before the policy loads; its
    path, or None for the other routes (the trainer makes those). Every process that loads
    the data calls this; the first computes under a file lock, the others find its table."""
    datasets = [d for d in datasets if d is not None]
    route = pi_0_route(cfg, pi_0)
    if route != "apart":
        return None
    path = pi_0_table_path(cfg, pi_0, route, datasets)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_suffix(".lock"))):
        if path.exists():
            cached_table(path, datasets, WHAT, REDO)
            LOG.info(f"POFE: pi_0's log-probs of the candidates are cached at {path}")
            return path
        save_table(path, compute_apart(cfg, pi_0_name(cfg, pi_0), datasets, scorer))
    LOG.info(f"POFE: cached pi_0's log-probs of the candidates at {path}")
    return path
