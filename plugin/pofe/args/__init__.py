"""POFE's configuration: everything POFE adds lives under the `pofe:` key.

`rl:` in axolotl is a closed enum, so `rl: rrhf` / `rl: sppo` are translated into
`pofe.method` before axolotl validates the config (see `translate_raw_config`), and the
run then takes axolotl's ordinary SFT builder path with POFE's trainer and collator.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pofe.args.nash_md import NashMDConfig, check_mixture_opponent
from pofe.args.online import OnlineConfig, check_online_block, check_online_recipe
from pofe.args.rounds import (
    EvalConfig,
    RoundPrompts,
    RoundPromptSource,
    StopWhen,
    check_round_prompt_count,
    check_round_prompt_files,
)
from pofe.args.translate import translate_raw_config
from pofe.columns import DEFAULT_LOGIT_CHUNK_SIZE
from pofe.methods import DATASET_TYPES, METHODS, check_candidate_rules, method_spec
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.config.strict import KnownKeys
from pofe_candidates.win_rates import SATURATION_BAND


class PofeConfig(KnownKeys):
    """The `pofe:` block."""

    # Errors never repeat the input: it may hold a key (pofe_candidates.config refuses those).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)
    # pi_0 has one name in keys, columns and files
    renamed_keys: ClassVar[dict[str, str]] = {"anchor_base": "pi_0"}

    method: str | None = Field(
        default=None,
        description="Set from `rl: rrhf` / `rl: sppo` (or a method registered with "
        "`pofe.methods.register_method`); POFE is inactive while unset.",
    )
    # RRHF (Yuan et al. 2023)
    rank_weight: float = Field(default=1.0, ge=0.0, description="Weight of the ranking hinge against SFT.")
    margin: float = Field(default=0.0, ge=0.0, description="Hinge margin between reward-ordered scores.")
    length_penalty: float = Field(
        default=1.0,
        ge=0.0,
        description="Scores are summed log-probs / length ** length_penalty.",
    )
    # SPPO (Wu et al. 2024)
    eta: float = Field(
        default=1000.0,
        gt=0.0,
        description="SPPO step size: log-ratio target is eta * (win_rate - 1/2).",
    )
    # TRL's (and the SPPO authors') name for 1 / eta; read into eta, and not written back
    # (`exclude`), so a validated block read again holds eta alone
    beta: float | None = Field(
        default=None,
        gt=0.0,
        exclude=True,
        description="SPPO: TRL's beta, 1 / eta (beta 0.001 = eta 1000); set one of the two.",
    )
    sppo_loss: Literal["soft", "hard"] = Field(
        default="soft",
        description="`soft`: regression on win rates; `hard`: TRL's sppo_hard on pairs.",
    )
    anchor_mix: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="SPPO regresses log pi - [(1 - anchor_mix) log pi_t + anchor_mix log pi_0] (Nash-MD's "
        "geometric mixture; anchor_mix = Nash-MD's eta * tau): a pull toward pi_0 against last-iterate "
        "cycles and drift. 0: the paper (anchor pi_t only).",
    )
    pi_0: str | None = Field(
        default=None,
        description="pi_0 for anchor_mix: a model folder, hub id or adapter folder (unset: the recipe's "
        "base_model; an iterated run sets it to its first policy).",
    )
    saturation_band: float = Field(
        default=SATURATION_BAND,
        gt=0.0,
        lt=0.5,
        description="A prompt is saturated when all its candidates' win rates lie within this of 1/2 "
        "(summary.json and the run report count them per round).",
    )
    # Nash-MD (Munos et al. 2023)
    nash_md: NashMDConfig | None = Field(
        default=None, description="Nash-MD: the mixture its opponents are sampled from."
    )
    # Performance (both leave the scores unchanged, up to float rounding)
    prefix_sharing: bool = Field(
        default=True,
        description="Encode each prompt once (`prefix_layout` says how); off automatically with sample packing.",
    )
    prefix_layout: Literal["auto", "packed", "cache"] = Field(
        default="auto",
        description="`packed`: `prompt, r_1..r_k` in one row with a block attention mask "
        "(eager/sdpa); `cache`: the prompt once, then the k responses over its KV cache "
        "(any backend); `auto`: cache where the backend takes no 4D mask, else per batch "
        "the one with fewer attention scores (`pofe.prefix`).",
    )
    logit_chunk_size: int = Field(
        default=DEFAULT_LOGIT_CHUNK_SIZE,
        ge=1,
        description="Response tokens per output-embedding chunk when scoring; no "
        "(tokens x vocab) logits beyond one chunk exist at a time.",
    )
    # Data
    truncation: Literal["truncate", "drop"] = Field(
        default="truncate",
        description="Rows longer than sequence_len: cut (prompt from the left, then "
        "responses) or drop them; both are counted in the log.",
    )
    max_prompt_len: int | None = Field(
        default=None,
        ge=1,
        description="Prompt tokens kept when truncating (default: sequence_len // 2).",
    )
    # Candidates from prompts (datasets of type pofe.prompts)
    generate: GenerateConfig | None = Field(default=None, description="How candidates are generated from prompts.")
    judge: JudgeConfig | None = Field(default=None, description="Who scores the candidates.")
    candidates: CandidatesConfig = Field(
        default_factory=CandidatesConfig,
        description="Where and how the generate/judge pipeline writes its shards.",
    )
    online: OnlineConfig | None = Field(
        default=None,
        description="Train online: resample and judge a pofe.prompts dataset's candidates from the moving "
        "policy every refresh_every steps inside one `axolotl train` (`pofe.online`).",
    )
    # Iterated runs (`axolotl pofe run`) and their evaluation (`axolotl pofe eval`)
    rounds: int = Field(
        default=1,
        ge=1,
        le=100,
        description="`axolotl pofe run`: generate -> judge -> train rounds; round t's "
        "trained model is round t+1's policy.",
    )
    round_prompts: RoundPrompts | list[RoundPromptSource] = Field(
        default="auto",
        description="Prompts per round: `split` (disjoint contiguous slices, round t gets "
        "slice t), `all` (every round sees every prompt), `auto` (split for sppo, all for rrhf), "
        "or a list of one prompt set per round (round t trains on the t-th): a local file, or a "
        "dataset spec as a `datasets:` entry names one ({path, name, split, data_files, ds_type, revision}).",
    )
    hub_dataset_id: str | None = Field(
        default=None,
        description="`axolotl pofe run`: push round t's candidates to the dataset repo "
        "`<hub_dataset_id>-iter<t>` (default with hub_model_id: `<hub_model_id>-iter<t>-data`).",
    )
    overwrite_output_dir: bool = Field(
        default=False,
        description="`axolotl pofe run`: write into an output_dir that holds files but no POFE run "
        "(same-named files are overwritten; the files found there are recorded, and never deleted).",
    )
    # off is `False`, not None: axolotl drops None values when it dumps the validated config
    eval: EvalConfig | Literal[False] = Field(
        default_factory=EvalConfig,
        description="`axolotl pofe eval`: the report's headline (each round's trained model on its "
        "own prompts) and, with held-out prompts, every iterate on them; `false` turns it off.",
    )
    stop_when: StopWhen | None = Field(
        default=None,
        description="`axolotl pofe run`: end the run after the round whose model fails this rule on the "
        "held-out prompts (unset: regressions are only flagged in the report).",
    )
    dataset_fields: list[dict[str, str]] = Field(
        default_factory=list,
        description="Internal: the `field_*` keys of each `datasets:` entry.",
    )

    @field_validator("method")
    @classmethod
    def _registered(cls, value: str | None) -> str | None:
        if value is not None:
            method_spec(value)  # the error lists the registered methods
        return value

    @field_validator("eval", mode="before")
    @classmethod
    def _eval_switch(cls, value: Any) -> Any:
        # `eval: false` (or null) turns evaluation off; `true` keeps the defaults
        if value is None:
            return False
        return {} if value is True else value

    def _check_own_keys(self) -> None:
        """A key only another method reads, set away from its default, would do nothing."""
        spec = method_spec(self.method)
        for other in METHODS.values():
            for key in other.own_keys:
                if key in spec.own_keys or getattr(self, key) == type(self).model_fields[key].default:
                    continue
                raise ValueError(f"pofe.{key}: {getattr(self, key)} applies to `rl: {other.name}` only")

    @model_validator(mode="before")
    @classmethod
    def _beta_or_eta(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("beta") is not None and data.get("eta") is not None:
            raise ValueError(
                f"pofe.beta ({data['beta']}) and pofe.eta ({data['eta']}) are both set: beta is TRL's name for "
                "1 / eta (beta 0.001 = eta 1000, the paper's); keep one"
            )
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> PofeConfig:
        if self.method is not None:
            self._check_own_keys()
        if self.pi_0 is not None and self.anchor_mix == 0.0:
            raise ValueError(
                f"pofe.pi_0 ({self.pi_0}) is the model pofe.anchor_mix mixes the anchor toward, and anchor_mix is 0 (the "
                "anchor is pi_t alone): set anchor_mix (e.g. 0.1), or drop pofe.pi_0"
            )
        if self.beta is not None:
            self.eta = 1.0 / self.beta
        if (self.generate is None) != (self.judge is None):
            raise ValueError("pofe.generate and pofe.judge go together: set both or neither")
        if self.eval and self.eval.judge is not None and self.judge is not None:
            raise ValueError(
                "pofe.eval.judge scores a trained model's evaluation when the recipe has no pofe.judge; this "
                "recipe's pofe.judge judges its evaluation too. For a second, independent judge: pofe.eval.judge2"
            )
        if self.method is not None:
            judge = self.judge
            check_candidate_rules(
                self.method,
                pairwise_judge=judge.type if judge is not None and judge.is_pairwise else None,
                keep=self.candidates.keep,
            )
        if self.online is not None and self.method is not None:
            check_online_block(self)
        if self.method is not None:
            check_mixture_opponent(self)
        if isinstance(self.round_prompts, list):
            check_round_prompt_count(self.round_prompts, self.rounds)
        if self.stop_when is not None:
            self._check_stop_when()
        generate = self.generate
        if self.rounds > 1 and generate is not None and generate.backend == "openai" and generate.serve is None:
            raise ValueError(
                "pofe.rounds > 1 generates from each round's new policy, which an already "
                "running OpenAI-compatible server (generate.base_url) does not serve: set "
                "generate.serve instead (POFE then starts a server for each round's policy, e.g. "
                '`serve: {command: "/path/to/vllm-venv/bin/vllm serve {model} --port {port} '
                '--served-model-name {served_model_name} {lora_modules}"}`), or use generate.backend '
                "transformers or vllm"
            )
        return self

    @property
    def online_scores_pi_0(self) -> bool:
        """Whether an online refresh scores its candidates under pi_0 too: for RRHF's `online.kl_coef`,
        SPPO's `anchor_mix` toward pi_0, or a loss with its own KL (Nash-MD's: the log shows it)."""
        kl_in_loss = method_spec(self.method).kl_in_loss
        return self.online is not None and (self.online.kl_coef > 0 or self.anchor_mix > 0 or kl_in_loss)

    @property
    def judges(self) -> list[tuple[str, JudgeConfig]]:
        """The recipe's judges with their keys: pofe.judge, pofe.eval.judge, pofe.eval.judge2 (those set)."""
        named = [("pofe.judge", self.judge)]
        if self.eval:
            named += [("pofe.eval.judge", self.eval.judge), ("pofe.eval.judge2", self.eval.judge2)]
        return [(key, judge) for key, judge in named if judge is not None]

    @property
    def kl_coef(self) -> float:
        """`pofe.online.kl_coef` (0 offline): what a method with the KL in its loss weighs it by."""
        return self.online.kl_coef if self.online is not None else 0.0

    def _check_stop_when(self) -> None:
        """`stop_when` reads the held-out evaluation; a falling reward needs a scalar judge."""
        if not self.eval or not self.eval.has_held_out:
            raise ValueError(
                "pofe.stop_when reads the held-out evaluation, which this recipe turns off: "
                "drop `pofe.eval: false` / `pofe.eval.held_out: 0`, or drop pofe.stop_when"
            )
        if self.stop_when.held_out_reward_falls and self.judge is not None and self.judge.is_pairwise:
            raise ValueError(
                f"pofe.stop_when.held_out_reward_falls needs a scalar reward, and the judge "
                f"(`{self.judge.type}`) is pairwise: use `lc_vs_previous_below` instead"
            )

    def check_files(self) -> None:
        """Check the files the block names on disk (each `round_prompts` file).

        Not a validator: the block is validated wherever it is read, and a disk check there
        would run at every read. `PofePlugin.register` calls this once per loaded recipe.
        """
        if isinstance(self.round_prompts, list):
            check_round_prompt_files(self.round_prompts)


def pofe_config(cfg: Any) -> PofeConfig:
    """The validated `pofe:` block of `cfg`; `PofeConfig()` when it has none.

    `cfg` is axolotl's validated cfg (a DictDefault), a raw YAML dict (where
    `rl: rrhf|sppo` counts as `pofe.method`, see `translate_raw_config`; `cfg` is not
    changed), or any object with a `pofe` attribute; the block itself is a dict or a
    `PofeConfig`. The one accessor: callers never branch on which.
    """
    if isinstance(cfg, Mapping):
        pofe = translate_raw_config(dict(cfg)).get("pofe")
    else:
        pofe = getattr(cfg, "pofe", None)
    if isinstance(pofe, PofeConfig):
        return pofe
    return PofeConfig.model_validate(dict(pofe or {}))


def check_top_level_keys(data: Mapping) -> None:
    """POFE's keys written beside axolotl's (`rank_weight: 5.0`) instead of under `pofe:`:
    axolotl ignores keys it does not know, so they would be dropped unread. Refused, naming
    where each goes. Keys axolotl also has (`max_prompt_len`) are axolotl's there."""
    from axolotl.utils.schemas.config import AxolotlInputConfig

    misplaced = [k for k in PofeConfig.model_fields if k in data and k not in AxolotlInputConfig.model_fields]
    if misplaced:
        moves = ", ".join(f"`{k}: {data[k]!r}` -> `pofe.{k}`" for k in misplaced)
        raise ValueError(
            f"{moves}: POFE's keys go under `pofe:`; at the recipe's top level axolotl drops them unread. "
            "Move them into the `pofe:` block."
        )


class PofeArgs(BaseModel):
    """Plugin input args merged into axolotl's config schema."""

    pofe: PofeConfig = Field(default_factory=PofeConfig, description="RRHF, SPPO and Nash-MD settings (POFE plugin).")

    @model_validator(mode="before")
    @classmethod
    def _translate_and_check_datasets(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        translate_raw_config(data)
        try:
            pofe = pofe_config(data)
        except ValidationError:
            return data  # the `pofe` field's own validation reports it, under `pofe.`
        method = pofe.method
        if method is None:
            return data
        check_top_level_keys(data)
        if data.get("sample_packing"):
            raise ValueError(
                "sample_packing: true cannot be used with POFE, which lays out the k "
                "candidates of each prompt itself; set sample_packing: false"
            )
        has_generate = pofe.generate is not None
        has_prompts = False
        for i, entry in enumerate(data.get("datasets") or []):
            # entries are raw dicts, or axolotl's dataset models once validated
            get = entry.get if isinstance(entry, dict) else partial(getattr, entry)
            dtype, path = get("type", None), get("path", None)
            if dtype == "pofe.prompts" and not has_generate:
                raise ValueError(
                    f"datasets[{i}] ({path}): type pofe.prompts needs pofe.generate and "
                    "pofe.judge, which turn prompts into scored candidates"
                )
            allowed = DATASET_TYPES.get(dtype) if isinstance(dtype, str) else None
            if allowed is None:
                raise ValueError(
                    f"datasets[{i}] ({path}): type {dtype!r} is not a POFE "
                    f"dataset type; with `rl: {method}` use one of "
                    f"{list(method_spec(method).dataset_types)}"
                )
            if method not in allowed:
                raise ValueError(f"datasets[{i}] ({path}): type {dtype} feeds {'/'.join(allowed)}, not `rl: {method}`")
            has_prompts = has_prompts or dtype == "pofe.prompts"
        if pofe.online is not None:
            check_online_recipe(data, pofe)
        if has_generate and not has_prompts:
            raise ValueError("pofe.generate is set but no dataset has type pofe.prompts to generate from")
        return data
