"""`pofe.PofePlugin`: the class a recipe lists under `plugins:`."""

from __future__ import annotations

from axolotl.integrations.base import BasePlugin

from .args import translate_raw_config


def _method(cfg) -> str | None:
    pofe = cfg.get("pofe")
    return pofe.get("method") if pofe else None


class PofePlugin(BasePlugin):
    """Adds `rl: rrhf` and `rl: sppo` to axolotl. Every hook is a no-op unless one is set."""

    def register(self, cfg: dict):
        # `rl:` is a closed enum in axolotl: take rrhf/sppo out before validation, so
        # the run follows the SFT builder path with POFE's trainer and collator.
        translate_raw_config(cfg)

    def get_input_args(self) -> str:
        return "pofe.args.PofeArgs"

    def load_datasets(self, cfg, preprocess: bool = False):
        if _method(cfg) is None:
            return None
        from .data.loader import load_pofe_datasets

        return load_pofe_datasets(cfg, preprocess)

    def get_trainer_cls(self, cfg):
        method = _method(cfg)
        if method is None:
            return None
        from .trainers import RRHFTrainer, SPPOTrainer

        return {"rrhf": RRHFTrainer, "sppo": SPPOTrainer}[method]

    def get_collator_cls_and_kwargs(self, cfg, is_eval: bool = False):
        if _method(cfg) is None:
            return None
        from .collator import KResponseCollator
        from .prefix import prefix_sharing_enabled

        return KResponseCollator, {"prefix_sharing": prefix_sharing_enabled(cfg, is_eval)}
