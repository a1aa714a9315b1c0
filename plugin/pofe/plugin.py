"""`pofe.PofePlugin`: the class a recipe lists under `plugins:`.

One `axolotl train` of a POFE recipe per output_dir: the first process of a launch holds
`<output_dir>/_pofe-train.lock` (`pofe.locks`) from the first hook that sees the datasets, before
anything is written or deleted there, to the end of training (or of the process, however it
ends but killed); a second is refused naming it. The file is removed when the lock is released:
a trained model's folder holds none.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from functools import partial
from importlib import import_module
from pathlib import Path
from typing import Any

from axolotl.integrations.base import BasePlugin

from pofe.args import PofeConfig, check_top_level_keys, pofe_config
from pofe.args.lengths import generation_fit
from pofe.args.translate import translate_raw_config
from pofe.compat.axolotl_internals import AXOLOTL_CONFIG_LOGGER, AXOLOTL_DEBUG_LOG
from pofe.errors import PofeError, show_pofe_errors
from pofe.locks import TRAIN_LOCK, FolderLock, describe
from pofe.logs import get_logger, redact_logger
from pofe.methods import method_spec
from pofe.paths import check_resumed_models, check_unexpanded_paths
from pofe.recipe_modules import add_recipe_dirs

LOG = get_logger(__name__)


class TrainingRefused(PofeError, RuntimeError):
    """Another training holds the output_dir."""


def debug_log(cfg: dict) -> str:
    """axolotl's log of a run, from the raw config (output_dir's default is axolotl's schema's)."""
    from axolotl.utils.schemas.config import AxolotlInputConfig

    output_dir = cfg.get("output_dir") or AxolotlInputConfig.model_fields["output_dir"].default
    return str(Path(output_dir) / AXOLOTL_DEBUG_LOG)


class PofePlugin(BasePlugin):
    """Adds `rl: rrhf`, `rl: sppo` and `rl: nash_md` to axolotl. Every hook is a no-op unless one is set."""

    # the last validated cfg and its `pofe:` block: axolotl hands every hook after `register`
    # the same validated cfg, so its block is validated once, not once per hook
    _validated: tuple[Any, PofeConfig] | None = None
    # axolotl's `--debug` flags, which only the raw config holds (`pofe.data.debug_rows`)
    _debug: tuple[int, bool] = (0, False)
    # the output_dir's lock while `axolotl train` runs in this process (`_hold_output_dir`)
    _train_lock: FolderLock | None = None
    # the training's trainer until it has trained, then its log history and steps, which the
    # console's last lines read (`post_train_unload`)
    _trainer: Any = None
    _logged: tuple[list[dict], int] | None = None

    def _pofe(self, cfg) -> PofeConfig:
        """The validated `pofe:` block of `cfg` (one process may run several jobs, each with
        its own cfg: a new cfg is validated anew)."""
        if self._validated is None or self._validated[0] is not cfg:
            self._validated = (cfg, pofe_config(cfg))
        return self._validated[1]

    def register(self, cfg: dict):
        # a POFE error ends the console with its message; the traceback goes to axolotl's own
        # log of the run (it tees the console to output_dir/debug.log), or the console with --debug;
        # in a stage of `axolotl pofe run`, it reaches the runner as its message
        show_pofe_errors(debug_log(cfg), debug=bool(cfg.get("debug")))
        # a judge module beside the recipe or in the working directory imports, here and in children
        add_recipe_dirs(cfg.get("axolotl_config_path"))
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
        if warning := generation_fit(cfg, pofe):
            LOG.warning(f"POFE: {warning}")
        # axolotl logs the whole config after this hook (console and output_dir/debug.log),
        # masking only its own key fields: a served policy's --api-key would be shown too.
        from pofe_candidates.config import redact_text

        redact_logger(AXOLOTL_CONFIG_LOGGER, redact_text)
        check_unexpanded_paths(cfg)
        check_resumed_models(cfg, [(f"{key}.model", j.model) for key, j in pofe.judges if j.spec.loads_weights])
        from pofe_candidates.judges import import_judge_functions

        for _, judge in pofe.judges:  # a broken judge module fails here, not after the model loads
            import_judge_functions(judge)
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
        if not preprocess:  # `axolotl train`'s first hook with its datasets, before it writes or deletes
            self._hold_output_dir(cfg)
        if pofe.online is not None:
            from pofe.online import load_online_prompts
            from pofe_candidates.generators.available import check_backend_runs

            if not preprocess:  # training samples at each refresh: refused now, not at the first one
                check_backend_runs(pofe.generate, online=True)
                return load_online_prompts(cfg, pofe)
            from pofe.data.prepared_summary import online_preprocess_summary

            meta = load_online_prompts(cfg, pofe)
            _say_at_exit(online_preprocess_summary(cfg, meta))
            return meta
        from pofe.data.loader import load_pofe_datasets

        meta = load_pofe_datasets(cfg, pofe, preprocess, debug=self._debug)
        if pofe.anchor_mix > 0:
            _prepare_pi_0_table(cfg, pofe, meta)
        if preprocess:
            from pofe.data.prepared_summary import preprocess_summary

            _say_at_exit(preprocess_summary(cfg, pofe, meta))
        return meta

    def _hold_output_dir(self, cfg) -> None:
        """One `axolotl train` per output_dir (`TRAIN_LOCK`, taken by the first process of the
        launch): a second would overwrite the first's checkpoints and, online, delete its
        refreshes as an earlier run's. Held until `post_train_unload`, or the process's end."""
        if int(os.environ.get("RANK", 0)) != 0:
            return
        path = Path(cfg.output_dir or "./model-out").resolve() / TRAIN_LOCK
        if self._train_lock is not None and self._train_lock.path == path:
            return  # a job of this process trains there again
        self._release_output_dir()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._train_lock = FolderLock.acquire(
            path, _warn, "axolotl train", partial(_in_use, path.parent), keep_file=False
        )

    def _release_output_dir(self) -> None:
        if self._train_lock is not None:
            self._train_lock.release()
            self._train_lock = None

    def post_trainer_create(self, cfg, trainer):
        if self._pofe(cfg).method is not None:
            self._trainer, self._logged = trainer, None

    def post_train(self, cfg, model):
        # called once trainer.train() returns, and again after the save: the first keeps the log
        if self._trainer is not None:
            self._logged = (list(self._trainer.state.log_history), self._trainer.state.global_step)
            self._trainer = None  # nor is the trainer (and its model) kept past axolotl's own references

    def post_train_unload(self, cfg):
        # axolotl's last hook of `axolotl train`, after "Model successfully saved": POFE's
        # summary ends the console, from the process that held the output_dir (rank 0)
        if self._logged is not None and self._train_lock is not None:
            from pofe.training_log import training_summary

            # axolotl's adapter asks torch.distributed for the rank, whose process group a
            # multi-process training has destroyed by now: the lock already says this is rank 0
            for line in training_summary(cfg, self._pofe(cfg), *self._logged):
                LOG.logger.info(line)
        self._logged = None
        self._release_output_dir()

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


def _say_at_exit(lines: list[str]) -> None:
    """Log `lines` as the process ends, unless in an error: `axolotl preprocess` runs no hook after
    the datasets load, and its own last line ("Success! Preprocessed data path") comes after them."""

    def say():
        if getattr(sys, "last_value", None) is None:  # set by Python for an exception that ended the process
            for line in lines:
                LOG.info(line)

    atexit.register(say)


def _warn(line: str) -> None:
    LOG.warning(f"POFE: {line}")


def _in_use(output_dir: Path, holder: dict) -> TrainingRefused:
    """The refusal of a second training in `output_dir`, naming the one that holds it."""
    pid = holder.get("pid") if holder.get("host") == socket.gethostname() else None
    return TrainingRefused(
        f"output_dir {output_dir} is in use by another `{holder.get('command', 'axolotl train')}` "
        f"({describe(holder)}): two trainings writing one output_dir would overwrite each other's checkpoints and "
        "model (and, online, replace each other's refreshes). Wait for it to finish"
        f"{f' or stop it (kill {pid})' if pid else ''}, or give this training an output_dir of its own."
    )


def _prepare_pi_0_table(cfg, pofe: PofeConfig, meta) -> None:
    """pi_0's log-probs of the rows (`pofe.anchor_mix`), when pi_0 loads apart from the policy:
    now, before the policy loads (`pofe.anchor.pi_0.prepare_pi_0_table`), scored as the
    trainer scores (its collator, `pofe.scoring`, its eval batch size)."""
    import os

    import torch
    from axolotl.loaders import load_tokenizer

    from pofe.anchor.pi_0 import prepare_pi_0_table
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
    prepare_pi_0_table(cfg, pofe.pi_0, [meta.train_dataset, meta.eval_dataset], scorer)
