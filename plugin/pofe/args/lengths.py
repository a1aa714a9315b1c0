"""A recipe's lengths read together, when the recipe is read (`PofePlugin.register`, `axolotl pofe
plan`): whether the candidates it generates fit the sequence length it trains at
(`pofe.length_policy.generation_fit_warning`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pofe.length_policy import generation_fit_warning

# axolotl's default sequence_len (`AxolotlInputConfig.sequence_len`)
AXOLOTL_SEQUENCE_LEN = 512


def generation_fit(cfg: Mapping[str, Any], pofe) -> str | None:
    """The warning for a recipe (`cfg`: its YAML or axolotl's cfg; `pofe`: its validated block)
    whose pofe.generate.max_new_tokens cannot train whole under its sequence_len; None when they
    fit, or it generates nothing."""
    if pofe.generate is None:
        return None
    return generation_fit_warning(
        int(cfg.get("sequence_len") or AXOLOTL_SEQUENCE_LEN),
        pofe.generate.max_new_tokens,
        pofe.max_prompt_len,
        pofe.generate.max_prompt_tokens,
        pofe.truncation,
    )
