"""candidates/summary.json: what a candidates folder holds, counted from its shards alone.

`pofe_candidates.pipeline` writes it after every (resumed) run, from the generate and judge
shards as read back from disk; `axolotl preprocess` on the same recipe writes it again. The run
report and a round's console line read it.
"""

from __future__ import annotations

import statistics
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from pofe.records import Record

# above this share of saturated prompts a win-rate round warns (`Saturation.warning`)
SATURATION_WARN_SHARE = 0.5


class LengthStats(BaseModel):
    """Token counts' mean, median and count (None for none)."""

    mean: float | None
    median: float | None
    count: int

    @classmethod
    def of(cls, tokens: list[int]) -> LengthStats:
        return cls(
            mean=sum(tokens) / len(tokens) if tokens else None,
            median=float(statistics.median(tokens)) if tokens else None,
            count=len(tokens),
        )


class CandidateLengths(BaseModel):
    """The lengths of every generated candidate and of each judged prompt's best and worst (as
    `keep: best_worst` keeps them). A judge that learns to prefer length shows here first: the
    best grow longer than the worst."""

    candidates: LengthStats
    best: LengthStats
    worst: LengthStats


class Saturation(BaseModel):
    """The judged prompts whose K win rates all lie within `band` of 1/2
    (`pofe_candidates.win_rates.saturation`): there SPPO's targets eta (w - 1/2) nearly vanish."""

    band: float
    prompts: int
    saturated_prompts: int
    saturated_share: float | None
    mean_abs_deviation: float | None

    @property
    def warns(self) -> bool:
        return self.saturated_share is not None and self.saturated_share > SATURATION_WARN_SHARE

    def warning(self, where: str) -> str | None:
        """The warning naming the remedies when the saturated share passes `SATURATION_WARN_SHARE`,
        else None. `where`: the round or file the numbers belong to."""
        if not self.warns:
            return None
        return (
            f"{where}: {self.saturated_prompts} of {self.prompts} prompts ({self.saturated_share:.0%}, above "
            f"{SATURATION_WARN_SHARE:.0%}) are saturated: all their candidates' win rates lie within "
            f"{self.band} of 1/2 (mean |w - 1/2| {self.mean_abs_deviation:.3f}), so SPPO's targets "
            "eta (w - 1/2) and its gradient nearly vanish. Remedies: sample more diverse candidates (a higher "
            "pofe.generate.temperature or more num_candidates), more diverse or harder prompts, or a stronger "
            "judge that tells the candidates apart."
        )


class PerPrompt(BaseModel):
    mean: float | None
    min: int
    max: int


class WorstOrderSum(BaseModel):
    sum: float
    row: int


class CandidatesSummary(Record):
    """summary.json. Every prompt is a row or a counted drop: rows_in == rows + sum(rows_dropped).

    Rewards are over the judged candidates (None for a pairwise judge, which gives none); the
    policy's samples are the candidates of source "policy" (not a dataset's responses). Win rates,
    spread and saturation are for methods on win rates (None otherwise). The facts of the last run
    alone (`*_last_run`: shards redone, timings, request counts) and what training adds later
    (`length_policy`) are kept as written.
    """

    # 2: the candidates' lengths, the policy samples' mean reward and this field are recorded
    FORMAT: ClassVar[int] = 2
    model_config = ConfigDict(extra="allow")

    format: Literal[2] = 2
    method: str
    rows_in: int
    rows: int
    rows_dropped: dict[str, int]
    prompts_truncated: int
    candidates_per_prompt: PerPrompt
    candidates_by_source: dict[str, int]
    duplicates_removed: dict[str, int]
    empty_candidates_removed: int
    candidates_cut_at_user_turn: int
    truncated_candidates_dropped: int
    mean_candidate_reward: float | None
    mean_best_of_k_reward: float | None
    mean_policy_sample_reward: float | None
    mean_candidate_tokens: float | None
    mean_candidate_chars: float | None
    lengths: CandidateLengths | None  # None without a candidate
    candidates_with_sampled_ids: int
    candidates_without_sampled_ids: int
    candidates_retokenized_differently: int
    mean_best_win_rate: float | None
    mean_win_rate_spread: float | None
    saturation: Saturation | None
    judge_verdicts: int
    judge_abstentions: int
    judge_abstention_reasons: dict[str, int]
    judge_abstention_rate: float
    judge_prompts_cut: int
    judge_rows_with_prompt_cut: int
    rows_with_equal_labels: int
    judge_pairs_order_sum_off: int
    judge_worst_order_sum: WorstOrderSum | None
    data_sha256: str
    generate: dict
    judge: dict
    pipeline: dict
