"""Evaluation's statistics (`pofe.run.evaluation.statistics`): length-controlled win rates and
bootstrap intervals, for judges that prefer length, quality, or both."""

from __future__ import annotations

import math

import pytest
import torch

from pofe.run.evaluation.statistics import (
    block_win_matrix,
    bootstrap_win_matrix,
    fit_length_logistic,
    pair_observations,
)
from pofe_candidates.win_rates import bradley_terry_preferences

SEEDS = range(5)


def lengths(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Model A's answers 10-49 tokens, B's 1-29: A is longer about 80 % of the time."""
    return torch.randint(10, 50, (n,), generator=g).double(), torch.randint(1, 30, (n,), generator=g).double()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_judge_that_only_likes_length_gives_lc_one_half(seed):
    """Deterministic (the longer one wins, ties split) and noisy (P(win) rising with the
    length difference): raw win rate well above 1/2, length-controlled within 0.05 of it."""
    g = torch.Generator().manual_seed(seed)
    la, lb = lengths(g, 4096)
    d = la - lb
    longer = (d > 0).double() + 0.5 * (d == 0).double()
    noisy = torch.bernoulli(torch.sigmoid(3 * torch.tanh(d / 10)), generator=g)
    for pref in (longer, noisy):
        fit = fit_length_logistic(pref, d)
        assert fit["raw"] > 0.75 and fit["raw"] == pytest.approx(pref.mean().item())
        assert abs(fit["lc"] - 0.5) < 0.05 and fit["b"] > 1
    # the deterministic judge's raw rate by hand: P(A longer) + P(tie) / 2
    assert fit_length_logistic(longer, d)["raw"] == pytest.approx(((d > 0).sum() + 0.5 * (d == 0).sum()).item() / 4096)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_judge_blind_to_length_keeps_lc_at_the_raw_rate(seed):
    """A wins 70 % of comparisons whatever the lengths: LC ~ raw ~ 0.7 (the slope ~ 0)."""
    g = torch.Generator().manual_seed(seed)
    la, lb = lengths(g, 4096)
    pref = torch.bernoulli(torch.full((4096,), 0.7, dtype=torch.float64), generator=g)
    fit = fit_length_logistic(pref, la - lb)
    assert abs(fit["raw"] - 0.7) < 0.03 and abs(fit["lc"] - fit["raw"]) < 0.03


def test_quality_and_length_separate():
    """P(A wins) = sigmoid(1 + 2 tanh(d / s)) with the fit's own s: the fit recovers
    a = 1 (LC = sigmoid(1) = 0.731) and b = 2, where the raw rate mixes both."""
    g = torch.Generator().manual_seed(0)
    la, lb = lengths(g, 20000)
    d = la - lb
    s = d.std(correction=0)
    pref = torch.bernoulli(torch.sigmoid(1 + 2 * torch.tanh(d / s)), generator=g)
    fit = fit_length_logistic(pref, d)
    assert fit["a"] == pytest.approx(1.0, abs=0.1) and fit["b"] == pytest.approx(2.0, abs=0.15)
    assert fit["lc"] == pytest.approx(1 / (1 + math.exp(-1)), abs=0.02) and fit["raw"] > 0.8


def test_no_length_difference_and_abstentions():
    """Equal lengths: f = 0, the fit is the intercept alone, LC = raw; NaN verdicts left out."""
    pref = torch.tensor([1.0, 0.0, 1.0, float("nan"), 1.0])
    fit = fit_length_logistic(pref, torch.zeros(5))
    assert fit["n"] == 4 and fit["raw"] == pytest.approx(0.75) and fit["lc"] == pytest.approx(0.75, abs=1e-6)
    assert fit_length_logistic(torch.tensor([float("nan")]), torch.zeros(1))["lc"] is None


def test_pair_observations_from_a_scalar_length_judge():
    """A reward that is the answer's length, through Bradley-Terry as evaluation judges: the
    observations pair model a's samples with model b's, prompt by prompt."""
    g = torch.Generator().manual_seed(0)
    P, M, S = 200, 3, 2
    tokens = torch.randint(1, 20, (P, M, S), generator=g).double()
    tokens[:, 2] += 8  # model 2 writes longer answers
    pref = bradley_terry_preferences((tokens / 4).reshape(P, M * S))  # (P, M*S, M*S)
    y, d = pair_observations(pref, tokens, 2, 0)
    assert y.shape == d.shape == (P, S * S)
    assert d[7, 1 * S + 0].item() == tokens[7, 2, 1].item() - tokens[7, 0, 0].item()
    assert y[7, 1 * S + 0].item() == pytest.approx(1 / (1 + math.exp(-d[7, 1 * S + 0].item() / 4)))
    fit = fit_length_logistic(y, d)
    assert fit["raw"] == pytest.approx(block_win_matrix(pref, M, S)[2, 0].item())
    assert fit["raw"] > 0.75 and abs(fit["lc"] - 0.5) < 0.05


def test_bootstrap_interval_over_prompts():
    """Seeded: the same interval twice; it holds the point estimate; its width shrinks as
    ~1/sqrt(prompts) (a 0/1 verdict per prompt: the interval's half-width is about
    1.96 * sqrt(p (1 - p) / P))."""
    g = torch.Generator().manual_seed(1)
    for P in (100, 1600):
        wins = torch.bernoulli(torch.full((P,), 0.7, dtype=torch.float64), generator=g)
        per_prompt = torch.full((P, 2, 2), 0.5, dtype=torch.float64)  # [p, a, b]: a beats b on p
        per_prompt[:, 1, 0], per_prompt[:, 0, 1] = wins, 1 - wins
        lo, hi = bootstrap_win_matrix(per_prompt, seed=0)
        again = bootstrap_win_matrix(per_prompt, seed=0)
        assert torch.equal(lo, again[0]) and torch.equal(hi, again[1])
        point = wins.mean().item()
        assert lo[1, 0] <= point <= hi[1, 0] and lo[0, 0] == hi[0, 0] == 0.5
        half = 1.96 * math.sqrt(point * (1 - point) / P)
        assert (hi[1, 0] - lo[1, 0]).item() / 2 == pytest.approx(half, rel=0.2)


def test_reward_comparisons_by_hand():
    """Two prompts, pi_0 scores [0, 0.5], pi_1 [1, 0.5] (one sample each): means 0.25 and 0.75,
    difference +0.5. Resampling the two prompts: both prompt 0 (p = 1/4) gives a difference of
    1, both prompt 1 (1/4) gives 0, one of each 0.5; so the 2.5 % and 97.5 % quantiles are 0 and 1,
    and pi_0's own mean ranges over 0..0.5. pi_2 abstained (NaN) on prompt 1's first sample: its
    mean is over the rewards it has, (0.25 + 0.75) / 2 = 0.5, as eval.json's mean_reward; its
    difference to pi_1 is -0.25. (Two prompts are too few for an interval, test below: the
    arithmetic is checked with `min_prompts` lowered.)"""
    from pofe.run.evaluation.statistics import reward_comparisons

    nan = float("nan")
    rewards = torch.tensor(
        [[[0.0, 0.0], [1.0, 1.0], [0.25, 0.25]], [[0.5, 0.5], [0.5, 0.5], [nan, 0.75]]], dtype=torch.float64
    )  # (P=2, M=3, S=2)
    out = reward_comparisons(rewards, draws=2000, seed=0, min_prompts=1)
    assert out["reward_ci95"][0] == pytest.approx([0.0, 0.5])
    assert out["reward_vs_pi_0"][0] is None and out["reward_vs_previous"][0] is None
    assert out["reward_vs_pi_0"][1]["diff"] == pytest.approx(0.5)
    assert out["reward_vs_pi_0"][1]["diff_ci95"] == pytest.approx([0.0, 1.0])
    assert out["reward_vs_previous"][2]["diff"] == pytest.approx(5 / 12 - 0.75)


def test_too_few_prompts_give_no_interval():
    """Issue 50: one held-out prompt (pi_0 scores 0, pi_1 2.5) gave the difference +2.5 the
    interval [+2.5, +2.5], width 0 from one prompt, read as evidence. Below
    `MIN_INTERVAL_PROMPTS` (6) prompts no interval is computed: every interval is None, and each
    comparison says how many prompts it read; from 6 prompts on there is one."""
    from pofe.run.evaluation.statistics import MIN_INTERVAL_PROMPTS, compare_iterates, reward_comparisons

    assert MIN_INTERVAL_PROMPTS == 6
    for P in (1, 5):
        rewards = torch.tensor([[[0.0], [2.5]]] * P, dtype=torch.float64)  # (P, M=2, S=1)
        out = reward_comparisons(rewards)
        assert out["reward_ci95"] == [[None, None], [None, None]] and out["reward_prompts"] == [P, P]
        assert out["reward_vs_pi_0"][1] == {"diff": 2.5, "diff_ci95": [None, None], "prompts": P}
        pref = bradley_terry_preferences(rewards.reshape(P, 2))
        comparisons = compare_iterates(pref, torch.ones(P, 2, 1), seed=0)
        assert comparisons["win_matrix_ci95"] == [[[0.5, 0.5], [None, None]], [[None, None], [0.5, 0.5]]]
        versus = comparisons["vs_pi_0"][1]
        assert versus["raw_ci95"] == versus["lc_ci95"] == [None, None] and versus["prompts"] == P
    rewards = torch.tensor([[[0.0], [2.5]]] * 6, dtype=torch.float64)
    assert reward_comparisons(rewards)["reward_vs_pi_0"][1]["diff_ci95"] == [2.5, 2.5]
    # a prompt where pi_1 abstained on every sample does not count for its interval
    rewards[0, 1, 0] = float("nan")
    out = reward_comparisons(rewards)
    assert out["reward_prompts"] == [6, 5] and out["reward_vs_pi_0"][1]["prompts"] == 5
    assert out["reward_ci95"][1] == out["reward_vs_pi_0"][1]["diff_ci95"] == [None, None]
