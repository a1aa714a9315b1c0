"""eval/headline.json: each round's trained model beside the best of its own candidates.

`axolotl pofe eval` writes it (`pofe.run.evaluation.headline`): round t's model pi_t answers the
first `pofe.eval.train_prompts` prompts round t judged, the recipe's scalar judge scores the
answers, and the record sets them beside the same prompts' candidates. The run report renders it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from pofe.records import Record


class HeadlineAnswer(BaseModel):
    """One answer of a round's model to one of its headline prompts, beside the prompt's best
    candidate (its highest reward, the first of equals)."""

    index: int  # the prompt's row in the round's candidates
    sample: int
    prompt: str | list[dict[str, Any]]  # as the dataset gave it
    prompt_text: str  # a chat prompt's last user turn
    completion: str
    tokens: int
    reward: float
    best_candidate: str
    best_candidate_reward: float


class RoundHeadline(BaseModel):
    """A round's model and its mean reward on the headline prompts, beside the same prompts'
    candidates: their mean, their best-of-k (the mean over prompts of the best reward) and the
    starting policy's own samples' mean (None without any)."""

    model: str
    num_prompts: int
    model_mean_reward: float | None
    candidates_mean_reward: float | None
    candidates_best_of_k_reward: float | None
    policy_sample_mean_reward: float | None
    samples: list[HeadlineAnswer]


class HeadlineDecoding(BaseModel):
    num_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int | None


class Headline(Record):
    """headline.json: how the headline was drawn, each evaluated round's entry (by round, "1",
    "2", ...), or why there is none (`skipped`), and the evaluation's peak memory."""

    # 2: each round's entry holds its candidates' side and each answer's best candidate
    FORMAT: ClassVar[int] = 2
    format: Literal[2] = 2
    train_prompts: int
    skipped: str | None
    judge: dict[str, Any]
    decoding: HeadlineDecoding
    rounds: dict[str, RoundHeadline]
    peak_memory: dict[str, Any]
