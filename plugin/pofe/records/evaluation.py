"""eval/eval.json: every model of a run on the held-out prompts, and what is read off them.

`axolotl pofe eval` writes it (`pofe.run.evaluation.records`): the numbers (rewards, the win-rate
matrix, lengths, KL to pi_0, perplexity, the comparisons between iterates with their intervals,
the rounds' best-of-k) and the readings (each judge's 3-cycles and spread, the model to use). The
run report renders it; `pofe.stop_when` reads it between rounds.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from pofe.records import Record

# [lower, upper]: a 95 % bootstrap interval; [None, None] where there is none (too few prompts,
# or no verdict)
Interval = list[float | None]


class EvaluatedModel(BaseModel):
    name: str  # pi_0, pi_1, ..., pi_avg
    path: str


class EvalDecoding(BaseModel):
    num_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int | None
    seed: int | None


class WinRateVersus(BaseModel):
    """One model's win rate against another (pi_0, or the iterate before it): raw and
    length-controlled (`lc`: at equal length, by the fitted `length_slope`), with intervals."""

    raw: float | None
    raw_ci95: Interval
    lc: float | None
    lc_ci95: Interval
    length_slope: float | None
    comparisons: int
    prompts: int


class RewardVersus(BaseModel):
    """One model's mean reward less another's, over the prompts both have a reward on."""

    diff: float | None
    diff_ci95: Interval
    prompts: int


class ResponseTokens(BaseModel):
    mean: list[float | None]
    median: list[float | None]


class RoundBestOfK(BaseModel):
    """Round t's candidates on the held-out prompts (from pi_{t-1}) beside its trained model."""

    round: int
    k: int
    mean_candidate_reward: float | None
    best_of_k_reward: float | None
    trained_mean_reward: float | None
    trained_minus_best_of_k: float | None


class Average(BaseModel):
    """pi_avg: its index among the models and the iterates it averages."""

    index: int
    of: list[str]


class Choice(BaseModel):
    """The model to use (`pofe.run.evaluation.decision.choose_model`): the best by reward (a
    scalar judge) or by length-controlled win rate against pi_0, whether it is better than pi_0
    beyond noise (`clear`; `no_interval`: why there is no interval to read), each iterate worse
    than the one before it, and the models left out for their KL to pi_0. The basis's figures
    are set, the other basis's None."""

    basis: Literal["reward", "win_rate"]
    best: int
    name: str
    clear: bool
    no_interval: str | None
    regressions: list[dict[str, Any]]  # the basis's statistic and interval under its own name
    over_kl_ceiling: list[str]
    kl_ceiling: float | None
    mean_reward: float | None = None
    reward_ci95: Interval | None = None
    diff_vs_pi_0: float | None = None
    diff_ci95: Interval | None = None
    lc_vs_pi_0: float | None = None
    lc_ci95: Interval | None = None
    raw_vs_pi_0: float | None = None


class EvalRecord(Record):
    """eval.json. Lists run over the models in `models`' order (pi_0 first); a `_judge2` field
    is the second judge's (`pofe.eval.judge2`; None without one). Rewards and their comparisons
    are a scalar judge's (None for a pairwise one); an abstention is left out of a mean and
    counted (`abstained`)."""

    # 2: the readings (cycles, spreads, the choice) are recorded and KL to pi_0 is `kl_to_pi_0`
    FORMAT: ClassVar[int] = 2
    format: Literal[2] = 2
    models: list[EvaluatedModel]
    num_prompts: int
    prompts_source: str
    decoding: EvalDecoding
    judge: dict[str, Any]
    judge2: dict[str, Any] | None
    win_matrix_method: str
    win_matrix: list[list[float | None]]
    win_matrix_ci95: list[list[Interval]]
    mean_reward: list[float | None] | None
    reward_count: list[int] | None
    abstained: list[int] | None
    win_matrix_judge2: list[list[float | None]] | None
    mean_reward_judge2: list[float | None] | None
    reward_count_judge2: list[int] | None
    abstained_judge2: list[int] | None
    mean_response_tokens: list[float | None]
    mean_response_chars: list[float | None]
    samples_cut_at_user_turn: list[int]
    kl_to_pi_0: list[float | None]
    kl_is_unbiased: bool
    perplexity: list[float | None] | None
    reference_count: int
    cycle_threshold: float
    vs_pi_0: list[WinRateVersus | None]
    vs_previous: list[WinRateVersus | None]
    response_tokens: ResponseTokens
    reward_ci95: list[Interval] | None = None
    reward_prompts: list[int] | None = None
    reward_vs_pi_0: list[RewardVersus | None] | None = None
    reward_vs_previous: list[RewardVersus | None] | None = None
    best_of_k: list[RoundBestOfK] | None
    peak_memory: dict[str, Any]
    average: Average | None
    kl_ceiling: float | None
    cycles: list[tuple[int, int, int]] | None
    win_matrix_spread: float | None
    cycles_judge2: list[tuple[int, int, int]] | None
    win_matrix_spread_judge2: float | None
    choice: Choice | None
