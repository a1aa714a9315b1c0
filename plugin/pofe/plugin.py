"""`pofe.PofePlugin`: the class a recipe lists under `plugins:`."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from axolotl.integrations.base import BasePlugin

from pofe.args import PofeConfig, check_top_level_keys, pofe_config
from pofe.args.translate import translate_raw_config
from pofe.errors import record_uncaught_errors
from pofe.logs import redact_logger
from pofe.methods import method_spec
from pofe.paths import check_unexpanded_paths


class PofePlugin(BasePlugin):
    """Adds `rl: rrhf`, `rl: sppo` and `rl: nash_md` to axolotl. Every hook is a no-op unless one is set."""

    # the last validated cfg and its `pofe:` block: axolotl hands every hook after `register`
    # the same validated cfg, so its block is validated once, not once per hook
    _validated: tuple[Any, PofeConfig] | None = None
    # axolotl's `--debug` flags, which only the raw config holds (`pofe.data.debug_rows`)
    _debug: tuple[int, bool] = (0, False)

    def _pofe(self, cfg) -> PofeConfig:
        """The validated `pofe:` block of `cfg` (one process may run several jobs, each with
        its own cfg: a new cfg is validated anew)."""
        if self._validated is None or self._validated[0] is not cfg:
            self._validated = (cfg, pofe_config(cfg))
        return self._validated[1]

    def register(self, cfg: dict):
        # in a stage of `axolotl pofe run`, a POFE error reaches the runner as its message
        record_uncaught_errors()
        # `rl:` is a closed enum in axolotl: take rrhf/sppo out before validation, so
        # the run follows the SFT builder path with POFE's trainer and collator.
        translate_raw_config(cfg)
        from pofe.data.debug_rows import debug_request

        self._debug = debug_request(cfg)
        # Validate the block now, on its own: axolotl's config model repeats each rejected
        # input in its errors, and a key pasted into `pofe:` must be refused unrepeated.
        # Files it names are checked here, once per loaded recipe (`axolotl.cli.config.load_cfg`
        # calls this hook, so `pofe.run.recipe.load_recipe` does too).
        pofe = pofe_config(cfg)
        pofe.check_files()
        if pofe.method is not None:
            check_top_level_keys(cfg)  # here too, before axolotl's schema repeats the whole recipe in its error
        # axolotl logs the whole config after this hook (console and output_dir/debug.log),
        # masking only its own key fields: a served policy's --api-key would be shown too.
        from pofe_candidates.config import redact_text

        redact_logger("axolotl.cli.config", redact_text)
        check_unexpanded_paths(cfg)
        from pofe.distributed import skip_deepspeed_shm_build

        skip_deepspeed_shm_build(cfg)  # before load_cfg starts DeepSpeed's comm

    def get_input_args(self) -> str:
        return "pofe.args.PofeArgs"

    def pre_model_load(self, cfg):
        if self._pofe(cfg).method is None:
            return
        from pofe.distributed import place_ranks_on_cpu

        place_ranks_on_cpu(cfg)
        if cfg.seed is not None:
            from transformers import set_seed

            # axolotl seeds only in the Trainer, after the model is built: a LoRA adapter's
            # random A matrices would differ from run to run, and so would its training
            set_seed(cfg.seed)

    def load_datasets(self, cfg, preprocess: bool = False):
        pofe = self._pofe(cfg)
        if pofe.method is None:
            return None
        if pofe.online is not None:
            from pofe.online import load_online_prompts

            return load_online_prompts(cfg, pofe)
        from pofe.data.loader import load_pofe_datasets

        meta = load_pofe_datasets(cfg, pofe, preprocess, debug=self._debug)
        if pofe.anchor_mix > 0:
            _prepare_pi_0_table(cfg, pofe, meta)
        return meta

    def get_training_args_mixin(self) -> str:
        # merged into axolotl's TrainingArguments when axolotl.core.training_args is imported
        return "pofe.training_args.PofeTrainingArgsMixin"

    def get_training_args(self, cfg):
        pofe = self._pofe(cfg)
        if pofe.method is None:
            return None
        from axolotl.core.training_args import AxolotlTrainingArguments

        from pofe.training_args import PofeTrainingArgsMixin, pofe_training_args

        # axolotl merges the mixin only if this plugin registered before that module was
        # first imported; otherwise say so, instead of the builder's "unexpected keyword"
        if not issubclass(AxolotlTrainingArguments, PofeTrainingArgsMixin):
            raise RuntimeError(
                "axolotl's TrainingArguments lack POFE's fields: axolotl.core.training_args was "
                "imported before PofePlugin registered. Load the config (axolotl.cli.config."
                "load_cfg) before importing axolotl's trainer builders."
            )
        return pofe_training_args(pofe)

    def get_trainer_cls(self, cfg):
        method = self._pofe(cfg).method
        if method is None:
            return None
        # imported only now: a trainer module pulls in the training stack
        module, _, name = method_spec(method).trainer.rpartition(".")
        trainer = getattr(import_module(module), name)
        if self._pofe(cfg).online is not None:
            from pofe.online import online_trainer

            return online_trainer(trainer)
        return trainer

    def get_collator_cls_and_kwargs(self, cfg, is_eval: bool = False):
        pofe = self._pofe(cfg)
        if pofe.method is None:
            return None
        from pofe.collator import KResponseCollator
        from pofe.prefix import prefix_sharing_enabled

        kwargs = {"prefix_sharing": prefix_sharing_enabled(cfg, pofe, is_eval)}
        if pofe.online is not None:
            from pofe.online import PromptCollator

            return PromptCollator, kwargs
        return KResponseCollator, kwargs


def _prepare_pi_0_table(cfg, pofe: PofeConfig, meta) -> None:
    """pi_0's log-probs of the rows (`pofe.anchor_mix`), when pi_0 loads apart from the policy:
    now, before the policy loads (`pofe.anchor.pi_0.prepare_base_table`), scored as the
    trainer scores (its collator, `pofe.scoring`, its eval batch size)."""
    import os

    import torch
    from axolotl.loaders import load_tokenizer

    from pofe.anchor.pi_0 import prepare_base_table
    from pofe.anchor.table import RowScorer
    from pofe.collator import KResponseCollator
    from pofe.prefix import prefix_sharing_enabled
    from pofe.scoring import score_candidates

    rank = int(os.environ.get("LOCAL_RANK", 0))
    scorer = RowScorer(
        collate=KResponseCollator(load_tokenizer(cfg), prefix_sharing=prefix_sharing_enabled(cfg, pofe, is_eval=True)),
        score=lambda model, batch: score_candidates(
            model, batch, chunk_size=pofe.logit_chunk_size, prefix_layout=pofe.prefix_layout
        ),
        batch_size=cfg.eval_batch_size or cfg.micro_batch_size or 1,
        device=torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu"),
    )
    prepare_base_table(cfg, pofe.anchor_base, [meta.train_dataset, meta.eval_dataset], scorer)
