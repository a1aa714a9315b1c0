"""The recipe's raw YAML as POFE translates it before axolotl validates it.

`rl:` in axolotl is a closed enum: `rl: rrhf | sppo` moves under `pofe.method`; the dataset
entries' `field_*` keys (which axolotl's dataset schema drops) are copied under
`pofe.dataset_fields`; axolotl's LoRA kernels are turned off for a LoRA recipe that states
none; axolotl's names for DPO's beta are refused, naming POFE's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from pofe.columns import DEFAULT_FIELDS
from pofe.methods import METHODS
from pofe_candidates.config.strict import check_keys

# Per-dataset column overrides. Axolotl's dataset schema drops unknown keys, so these
# are copied out of each `datasets:` entry into `pofe.dataset_fields` before validation.
FIELD_KEYS = tuple(DEFAULT_FIELDS)


# axolotl's fused LoRA kernels (`keep_lora_kernels_off`)
LORA_KERNELS = ("lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel", "lora_embedding_kernel")


def translate_raw_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Move `rl: rrhf|sppo` and dataset `field_*` keys under `pofe:`, in place.

    Runs on the raw YAML dict (from `PofePlugin.register`) and again in the args
    model's before-validator, so configs validated directly behave the same. Idempotent.
    """
    rl = cfg.get("rl")
    rl = getattr(rl, "value", rl)
    if isinstance(rl, str) and rl not in METHODS:
        _check_axolotl_rl(rl)
    pofe = cfg.get("pofe")
    if pofe is None:
        pofe = {}
    elif isinstance(pofe, BaseModel):
        pofe = pofe.model_dump()
    else:
        pofe = dict(pofe)
    if rl in METHODS:
        if pofe.get("method") not in (None, rl):
            raise ValueError(f"`rl: {rl}` contradicts `pofe.method: {pofe['method']}`; keep one.")
        pofe["method"] = rl
        cfg.pop("rl")
    if pofe.get("method") is None:
        return cfg
    _check_axolotl_beta(cfg)
    keep_lora_kernels_off(cfg)
    entries = cfg.get("datasets") or []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict):
            _check_field_keys(entry, i)
    if not pofe.get("dataset_fields") and entries:
        pofe["dataset_fields"] = [
            {key: entry[key] for key in FIELD_KEYS if entry.get(key) is not None} for entry in entries
        ]
    cfg["pofe"] = pofe
    return cfg


def keep_lora_kernels_off(cfg: dict[str, Any]) -> None:
    """Set axolotl's LoRA kernels off for a LoRA / QLoRA recipe that states none of them.

    axolotl turns them on for LoRA unless `rl` is set ("RL trainers not tested"); POFE removes
    `rl`, and its trainers are as untested with them, so it does what axolotl does for its own.
    A recipe that sets any of them keeps its choice (axolotl then enables no other either).
    """
    if cfg.get("adapter") not in ("lora", "qlora") or any(cfg.get(k) is not None for k in LORA_KERNELS):
        return
    for key in LORA_KERNELS:
        cfg[key] = False


# axolotl's names for DPO's beta, which POFE's trainers never read
AXOLOTL_BETA_KEYS = ("rl_beta", "dpo_beta")


def _check_axolotl_beta(cfg: dict[str, Any]) -> None:
    """axolotl's beta (`rl_beta`, `dpo_beta`, `trl.beta`) set for a POFE method would do nothing:
    refused, with the key that does what it means."""
    trl = cfg.get("trl")
    found = [(k, cfg[k]) for k in AXOLOTL_BETA_KEYS if cfg.get(k) is not None]
    if isinstance(trl, Mapping) and trl.get("beta") is not None:
        found.append(("trl.beta", trl["beta"]))
    if found:
        key, value = found[0]
        raise ValueError(
            f"`{key}: {value}` is axolotl's DPO beta, which POFE's trainers do not read. SPPO's is "
            f"`pofe.beta: {value}` (TRL's beta, 1 / pofe.eta: eta {1 / value:g}); RRHF has none. Move it there."
        )


def _check_field_keys(entry: dict[str, Any], i: int) -> None:
    """A `field_*` key POFE does not read on a dataset entry is a typo: axolotl's dataset schema
    would drop it unread, and the column it meant would fall back to its default."""
    unknown = {k: v for k, v in entry.items() if k.startswith("field_") and k not in FIELD_KEYS}
    if unknown:
        try:
            check_keys(unknown, FIELD_KEYS)
        except ValueError as e:
            raise ValueError(f"datasets[{i}] ({entry.get('path')}): {e} (the `field_*` keys POFE reads)") from None


def _check_axolotl_rl(rl: str) -> None:
    from axolotl.utils.schemas.enums import RLType

    known = [t.value for t in RLType]
    if rl not in known:
        raise ValueError(f"unknown `rl: {rl}`: POFE adds {list(METHODS)}; axolotl itself knows {known}")
