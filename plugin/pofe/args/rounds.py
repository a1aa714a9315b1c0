"""Typed config for iterated runs (`axolotl pofe run`) and their evaluation (`axolotl pofe eval`).

The `pofe.eval` block is declared here (pydantic only, no torch), so `pofe.args` can
import it cheaply; the rounds themselves are flat keys of `PofeConfig` (`pofe.rounds`,
`pofe.round_prompts`, `pofe.hub_dataset_id`), whose rules live here
(`check_round_prompt_count`, `check_round_prompt_files`). Decoding fields take their bounds from
`pofe_candidates.config`, where `pofe.generate` declares the same ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from pofe import methods
from pofe_candidates.config import BatchSize, GenerateConfig, JudgeConfig, MaxNewTokens, Seed, Temperature, TopP
from pofe_candidates.config.strict import KnownKeys

# `auto` takes the method's default (`MethodSpec.default_round_prompts`)
RoundPrompts = Literal["auto", methods.RoundPrompts]


class RoundPromptSet(KnownKeys):
    """One round's prompts named as a `datasets:` entry names its data, and loaded the same way
    (axolotl's `load_dataset_with_config`): a hub dataset id, or a local folder (with
    `data_files`, a `save_to_disk` folder or a dataset repo's files), with its config `name`
    and `split`."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="Hub dataset id, or a local file or folder.")
    name: str | None = Field(None, description="The dataset's configuration name.")
    split: str = Field("train", description="The split to read (slices too: train[:1000]).")
    data_files: str | list[str] | None = Field(
        None,
        description="Files to read, as axolotl reads them: within a hub repo, or (with a local folder) paths "
        "from the working directory.",
    )
    ds_type: str | None = Field(None, description="The files' format (json, parquet, ...) when not plain.")
    revision: str | None = Field(None, description="A hub dataset's branch, tag or commit.")


# one round's prompts: a local file, or a dataset spec
RoundPromptSource = str | RoundPromptSet


def check_round_prompt_count(files: list[RoundPromptSource], rounds: int) -> None:
    """`pofe.round_prompts` as a list: one prompt set per round, in round order."""
    if len(files) != rounds:
        raise ValueError(
            f"pofe.round_prompts lists {len(files)} prompt sets for pofe.rounds: {rounds}; give "
            "one per round (round t trains on the t-th), or a mode: auto, split, all"
        )


def check_round_prompt_files(files: list[RoundPromptSource]) -> None:
    """Each local file of `pofe.round_prompts` exists: checked on disk once, where a recipe is
    loaded (`PofeConfig.check_files`), not each time the block is validated. Dataset specs
    are checked where they load (`pofe.run.prompts.load_round_prompts`)."""
    for t, path in enumerate(files, start=1):
        if isinstance(path, RoundPromptSet):
            continue
        if not Path(path).is_file():
            raise ValueError(
                f"pofe.round_prompts[{t - 1}] (round {t}): no file at {path!r} (relative paths "
                "count from the directory axolotl runs in); give a local JSON/JSONL/Parquet file, or a "
                "dataset spec ({path: <hub id or folder>, name, split, data_files})"
            )


# keys that only shape the held-out evaluation: set without held-out prompts, they would do nothing
HELD_OUT_ONLY = (
    "prompt_column",
    "reference_column",
    "num_samples",
    "temperature",
    "max_new_tokens",
    "judge",
    "judge2",
    "cycle_threshold",
    "average_iterates",
)


class StopWhen(KnownKeys):
    """`pofe.stop_when`: end an iterated run after the round whose model fails a rule on the
    held-out prompts (checked after each round, `pofe.run.evaluation.decision`). Unset, a regressing round
    is only flagged in the report (REGRESSED); stopping is opt-in."""

    model_config = ConfigDict(extra="forbid")

    lc_vs_previous_below: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Stop after round t when pi_t's length-controlled win rate against pi_{t-1} on the "
        "held-out prompts is below this (0.5: any loss at equal length).",
    )
    held_out_reward_falls: bool = Field(
        False,
        description="Stop after round t when pi_t's mean held-out reward (scalar judge) is below pi_{t-1}'s.",
    )
    kl_to_pi_0_above: float | None = Field(
        None,
        gt=0.0,
        description="A ceiling on drift: stop after round t when pi_t's KL to pi_0 on the held-out prompts is "
        "above this (nats per response); 'which model to use' then keeps the best model under it.",
    )

    @model_validator(mode="after")
    def _some_rule(self) -> StopWhen:
        if self.lc_vs_previous_below is None and not self.held_out_reward_falls and self.kl_to_pi_0_above is None:
            raise ValueError(
                "pofe.stop_when sets no rule: give `lc_vs_previous_below: 0.5`, `held_out_reward_falls: true` "
                "and/or `kl_to_pi_0_above: <nats>` (or drop the key: regressions are then only flagged)"
            )
        return self


def samples_on_rounds_engine(backend: str, generate: GenerateConfig | None) -> bool:
    """Whether evaluation (`pofe.eval.backend`) samples the answers on the rounds' engine: auto,
    with an engine that can load any model of the run (in-process vLLM, or a server POFE starts
    for each model; a fixed base_url serves one model, not each iterate)."""
    if backend == "transformers" or generate is None:
        return False
    return generate.serve is not None or generate.backend == "vllm"


class EvalConfig(KnownKeys):
    """`pofe.eval`: the report's headline, and held-out prompts with their decoding and an
    optional second judge.

    On by default (`pofe.eval: false` turns it off), with a held-out slice of the prompt pool
    by default (`held_out`, `pofe.run.prompts`). The headline: each round's trained model
    answers the first `train_prompts` of the prompts the round judged (`train_samples` each at
    `train_temperature`, greedy by default, with the candidates' `pofe.generate.max_new_tokens`)
    and the recipe's scalar judge scores them, beside the best-of-k reward of those prompts'
    candidates. With held-out prompts (`prompts`, or `held_out`: the default), every model of
    the run (pi_0 = the recipe's base_model, pi_t = round t's output) also answers them with the same seeds; the recipe's `pofe.judge` scores them (and
    `judge2`, an independent judge, when set: the guard against judge exploitation).
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    prompts: str | None = Field(
        None,
        description="A local JSON/JSONL/Parquet file of held-out prompts (column `prompt_column`; "
        "optional `reference_column` for perplexity). Unset: the default `held_out` slice.",
    )
    held_out: int | None = Field(
        None,
        ge=0,
        description="Instead of `prompts`: hold out the LAST n rows of the recipe's pofe.prompts "
        "dataset (never trained on, in any round) and evaluate on them. Unset: 5 % of the pool, "
        "16 to 256 prompts, at most a fifth of it (`pofe.run.prompts`); 0: none.",
    )
    prompt_column: str = Field("prompt", description="Column holding the prompt.")
    reference_column: str = Field(
        "reference", description="Column holding a reference response (perplexity); optional."
    )
    num_samples: int = Field(4, ge=1, le=64, description="Held-out samples per prompt and model.")
    temperature: Temperature = Field(
        1.0,
        description="Held-out decoding: 0 = greedy (num_samples must be 1). The KL estimate is "
        "unbiased only at temperature 1 and top_p 1 (samples from pi_t itself).",
    )
    top_p: TopP = 1.0
    max_new_tokens: MaxNewTokens | None = Field(
        None,
        description="Held-out tokens per response. Unset: the candidates' pofe.generate.max_new_tokens "
        "(64 without a generate block), so that a held-out answer can be as long as a candidate; "
        "the headline always answers with the candidates' budget.",
    )
    batch_size: BatchSize = Field(16, description="Prompts per generate/score batch.")
    seed: Seed = Field(0, description="Sampling seed (the same for every model).")
    backend: Literal["auto", "transformers"] = Field(
        "auto",
        description="What samples every answer: auto = the rounds' engine when it can load each model of the "
        "run (`pofe.generate.backend: vllm`, or `pofe.generate.serve`), else `model.generate`; transformers = "
        "always `model.generate`. Log-probs always come from the transformers model.",
    )
    train_prompts: int = Field(
        16,
        ge=0,
        le=4096,
        description="The report's headline: score each round's trained model (scalar judge) on "
        "the first n prompts its round judged, beside those prompts' best-of-k candidate reward. "
        "0 = no headline.",
    )
    train_samples: int = Field(1, ge=1, le=64, description="Headline samples per prompt.")
    train_temperature: Temperature = Field(0.0, description="Headline decoding: 0 = greedy (train_samples must be 1).")
    judge: JudgeConfig | None = Field(
        None,
        description="The judge a trained model's evaluation scores with when the recipe has no pofe.judge (a "
        "recipe trained on a dataset of its own): the keys of pofe.judge.",
    )
    judge2: JudgeConfig | None = Field(None, description="A second, independent judge for evaluation only.")
    cycle_threshold: float = Field(
        0.5,
        ge=0.5,
        lt=1.0,
        description="Model a 'beats' b when win[a, b] > this; the report flags 3-cycles.",
    )
    average_iterates: bool = Field(
        False,
        description="Add pi_avg, the weights of pi_1..pi_T averaged (LoRA: the merged iterates'), as one more "
        "model: in the win-rate matrix, the lengths and the choice of which model to use (needs 2 rounds).",
    )

    def held_out_tokens(self, generate: GenerateConfig | None) -> int:
        """`max_new_tokens`, else the candidates' budget, else 64: a cap below the candidates'
        would cut every model's answers at one length and hide what the rounds did to length."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return generate.max_new_tokens if generate is not None else 64

    @property
    def has_held_out(self) -> bool:
        """Held-out prompts asked for: a file, or a slice of the pool (the default slice of a
        pool under 5 prompts is empty: then evaluation finds no held-out file)."""
        return self.prompts is not None or self.held_out != 0

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if self.prompts is not None and self.held_out:  # None (the default slice) gives way to a file
            raise ValueError("pofe.eval: set `prompts` or `held_out`, not both")
        if not self.has_held_out:
            # compared with the defaults, not `model_fields_set`: a dumped config validates again
            stray = [k for k in HELD_OUT_ONLY if getattr(self, k) != type(self).model_fields[k].default]
            if stray:
                raise ValueError(
                    f"pofe.eval.{stray[0]} shapes the held-out evaluation, but there are no held-out "
                    "prompts: set `prompts: path/to/file.jsonl` or `held_out: n` (the last n rows of "
                    f"the pofe.prompts dataset), or drop {', '.join(stray)}"
                )
        if self.temperature == 0.0 and self.num_samples != 1:
            raise ValueError("pofe.eval.temperature: 0 (greedy) gives one answer: set num_samples: 1")
        if self.train_temperature == 0.0 and self.train_samples != 1:
            raise ValueError("pofe.eval.train_temperature: 0 (greedy) gives one answer: set train_samples: 1")
        return self
