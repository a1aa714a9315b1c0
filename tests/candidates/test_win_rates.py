"""Tests for pofe_candidates.win_rates, with hand-computed matrices."""

from __future__ import annotations

import math

import pytest
import torch

from pofe.records.candidates import Saturation
from pofe_candidates import bradley_terry_preferences, symmetrize_preferences, win_rates
from pofe_candidates.win_rates import (
    hard_preferences,
    saturation,
    scalar_preferences,
    win_rate_spread,
)

NAN = float("nan")


def test_win_rates_hand_3x3_with_garbage_diagonal():
    """Off-diagonal P: row 0 (., .8, .6), row 1 (.2, ., .3), row 2 (.4, .7, .).

    The diagonal (NaN, 5, -1) counts as 0.5:
    w0 = (.5 + .8 + .6)/3 = 1.9/3, w1 = (.2 + .5 + .3)/3 = 1/3, w2 = (.4 + .7 + .5)/3 = 1.6/3.
    They sum to K/2 = 1.5, as for any P with P + P^T = 1.
    """
    p = torch.tensor([[NAN, 0.8, 0.6], [0.2, 5.0, 0.3], [0.4, 0.7, -1.0]])
    w = win_rates(p)
    torch.testing.assert_close(w, torch.tensor([1.9 / 3, 1 / 3, 1.6 / 3]))
    assert w.sum().item() == pytest.approx(1.5)


def test_win_rates_batch_shape():
    p0 = torch.tensor([[0.5, 0.8, 0.6], [0.2, 0.5, 0.3], [0.4, 0.7, 0.5]])
    p1 = torch.tensor([[0.5, 0.9, 0.9], [0.1, 0.5, 0.5], [0.1, 0.5, 0.5]])
    w = win_rates(torch.stack([p0, p1]))
    assert w.shape == (2, 3)
    torch.testing.assert_close(w[0], win_rates(p0))
    # p1: w = (2.3/3, 1.1/3, 1.1/3)
    torch.testing.assert_close(w[1], torch.tensor([2.3 / 3, 1.1 / 3, 1.1 / 3]))


def test_cycle_gives_half_each():
    """A > B > C > A, each with probability 0.9: every w = (0.5 + 0.9 + 0.1)/3 = 0.5.

    A scalar reward cannot express this; the win rates see a balanced cycle.
    """
    p = torch.tensor([[0.5, 0.9, 0.1], [0.1, 0.5, 0.9], [0.9, 0.1, 0.5]])
    torch.testing.assert_close(win_rates(p), torch.full((3,), 0.5))


def test_symmetrize_removes_position_bias():
    """True Q (P(i beats j)): (., .8, .6 / .2, ., .3 / .4, .7, .). The judge adds 0.1 to
    whichever response is shown first: A = Q + 0.1 off the diagonal, NaN on it.

    P01 = (A01 + 1 - A10)/2 = (.9 + 1 - .3)/2 = .8; P12 = (.4 + 1 - .8)/2 = .3;
    P20 = (.5 + 1 - .7)/2 = .4: Q comes back, diagonal 0.5.
    """
    q = torch.tensor([[0.5, 0.8, 0.6], [0.2, 0.5, 0.3], [0.4, 0.7, 0.5]])
    a = q + 0.1
    a.fill_diagonal_(NAN)
    p = symmetrize_preferences(a)
    torch.testing.assert_close(p, q)
    torch.testing.assert_close(p + p.T, torch.ones(3, 3))


def test_symmetrize_judge_that_always_picks_first():
    """A = 1 everywhere (first always wins): P = (1 + 1 - 1)/2 = 0.5 everywhere."""
    p = symmetrize_preferences(torch.ones(2, 3, 3))
    assert p.shape == (2, 3, 3)
    torch.testing.assert_close(p, torch.full((2, 3, 3), 0.5))


def test_bradley_terry_hand_values():
    """r = [0, ln 3, ln 9]: sigmoid(ln 3) = 3/4, sigmoid(ln 9) = 9/10.

    P = (.5, .25, .1 / .75, .5, .25 / .9, .75, .5);
    w = (.85/3, 1.5/3, 2.15/3): ordered as the rewards.
    """
    r = torch.tensor([0.0, math.log(3), math.log(9)])
    p = bradley_terry_preferences(r)
    expected = torch.tensor([[0.5, 0.25, 0.1], [0.75, 0.5, 0.25], [0.9, 0.75, 0.5]])
    torch.testing.assert_close(p, expected)
    torch.testing.assert_close(win_rates(p), torch.tensor([0.85 / 3, 0.5, 2.15 / 3]))


def test_bradley_terry_batch_and_transitive():
    """Scalar rewards can never form a cycle: P[i,j] > .5 and P[j,l] > .5 imply P[i,l] > .5."""
    g = torch.Generator().manual_seed(0)
    r = torch.randn(4, 5, generator=g)
    p = bradley_terry_preferences(r)
    assert p.shape == (4, 5, 5)
    torch.testing.assert_close(p[2], bradley_terry_preferences(r[2]))
    wins = p > 0.5  # (B, K, K)
    for b in range(4):
        for i in range(5):
            for j in range(5):
                for l in range(5):
                    if wins[b, i, j] and wins[b, j, l]:
                        assert wins[b, i, l]
    # win rates order responses exactly as rewards do
    assert torch.equal(win_rates(p).argsort(dim=1), r.argsort(dim=1))


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="pref"):
        win_rates(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="pref"):
        win_rates(torch.zeros(3))
    with pytest.raises(ValueError, match="first_wins"):
        symmetrize_preferences(torch.zeros(1, 2, 2, 2))
    with pytest.raises(ValueError, match="rewards"):
        bradley_terry_preferences(torch.zeros(1, 2, 2))


def test_bradley_terry_temperature_hand_values():
    """r = (0, 2), T = 2: P[0, 1] = sigmoid(-1) = 0.2689414, P[1, 0] = sigmoid(1) = 0.7310586;
    w = ((0.5 + 0.2689414) / 2, (0.5 + 0.7310586) / 2). T = 1 gives sigmoid(-2) = 0.1192029."""
    w = win_rates(bradley_terry_preferences(torch.tensor([0.0, 2.0]), temperature=2.0))
    torch.testing.assert_close(w, torch.tensor([0.3844707, 0.6155293]))
    assert bradley_terry_preferences(torch.tensor([0.0, 2.0]))[0, 1].item() == pytest.approx(0.1192029)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        bradley_terry_preferences(torch.tensor([0.0, 2.0]), temperature=0.0)


def test_hard_preferences_verifier_hand_values():
    """A verifier's rewards (1, 0, 1, 0.5): right beats wrong, equal ties.
    w_i = (#{r_j < r_i} + #{r_j = r_i} / 2) / 4, the self-pair a tie:
    w0 = (2 + 2/2) / 4 = 0.75, w1 = (0 + 1/2) / 4 = 0.125, w2 = 0.75, w3 = (1 + 1/2) / 4 = 0.375.
    Bradley-Terry at T = 1 on the same rewards stays near 1/2: w0 = (0.5 + s(1) + 0.5 + s(.5)) / 4."""
    r = torch.tensor([1.0, 0.0, 1.0, 0.5])
    p = hard_preferences(r)
    assert p.tolist() == [[0.5, 1.0, 0.5, 1.0], [0.0, 0.5, 0.0, 0.0], [0.5, 1.0, 0.5, 1.0], [0.0, 1.0, 0.0, 0.5]]
    torch.testing.assert_close(win_rates(p), torch.tensor([0.75, 0.125, 0.75, 0.375]))
    bt0 = (0.5 + 1 / (1 + math.exp(-1)) + 0.5 + 1 / (1 + math.exp(-0.5))) / 4
    assert win_rates(bradley_terry_preferences(r))[0].item() == pytest.approx(bt0)
    assert bt0 < 0.6
    # the limit: T -> 0 gives the hard matrix
    torch.testing.assert_close(bradley_terry_preferences(r, temperature=1e-3), p)


def test_hard_preferences_batch_and_int_rewards():
    p = hard_preferences(torch.tensor([[3, 1], [2, 2]]))
    assert p.dtype == torch.float32
    assert p.tolist() == [[[0.5, 1.0], [0.0, 0.5]], [[0.5, 0.5], [0.5, 0.5]]]


def test_scalar_preferences_dispatch():
    r = torch.tensor([0.0, 2.0])
    torch.testing.assert_close(scalar_preferences(r, "hard"), hard_preferences(r))
    torch.testing.assert_close(scalar_preferences(r, "bradley_terry", 2.0), bradley_terry_preferences(r, 2.0))
    with pytest.raises(ValueError, match="'authors' does not apply to scalar rewards"):
        scalar_preferences(r, "authors")


def test_win_rate_spread_hand_values():
    """Rows (0.75, 0.125, 0.75, 0.375) and (0.5, 0.5, 0.5, 0.5): spreads 0.625 and 0."""
    rates = torch.tensor([[0.75, 0.125, 0.75, 0.375], [0.5, 0.5, 0.5, 0.5]])
    assert win_rate_spread(rates).tolist() == [0.625, 0.0]
    assert win_rate_spread(rates[0]).item() == 0.625
    with pytest.raises(ValueError, match="K >= 1"):
        win_rate_spread(torch.zeros(2, 0))


def test_saturation_hand_values():
    """Band 0.05. Prompt 1 (0.52, 0.47, 0.5): max |w - 1/2| 0.03, saturated; prompt 2 (0.9, 0.1):
    0.4, not; prompt 3 (0.55, NaN, 0.45): the NaN left out, max 0.05 <= band, saturated (the
    band's edge counts, though 0.55 - 0.5 rounds to 0.05000000000000004 in float64); prompt 4
    (NaN,): nothing left, not counted.
    Share 2/3; mean |w - 1/2| over the 7 counted candidates
    (0.02 + 0.03 + 0 + 0.4 + 0.4 + 0.05 + 0.05) / 7 = 0.95 / 7."""
    rates = [[0.52, 0.47, 0.5], [0.9, 0.1], [0.55, NAN, 0.45], [NAN]]
    sat = saturation(rates, 0.05)
    assert sat["prompts"] == 3 and sat["saturated_prompts"] == 2
    assert sat["saturated_share"] == pytest.approx(2 / 3)
    assert sat["mean_abs_deviation"] == pytest.approx(0.95 / 7)
    assert saturation(rates, 0.04)["saturated_prompts"] == 1  # prompt 3 falls out at a narrower band
    empty = saturation([], 0.05)
    assert empty["prompts"] == 0 and empty["saturated_share"] is None and empty["mean_abs_deviation"] is None
    with pytest.raises(ValueError, match="band"):
        saturation(rates, 0.5)


def test_saturation_warning_names_the_remedies_above_half():
    """Warned above 50 % of the prompts saturated, not at it; the message names the numbers and
    the remedies (temperature, prompts, judge)."""
    half = saturation([[0.5, 0.5], [0.9, 0.1]], 0.05)
    assert half["saturated_share"] == 0.5 and Saturation(**half).warning("round 1") is None
    most = saturation([[0.5, 0.5], [0.51, 0.49], [0.9, 0.1]], 0.05)
    warning = Saturation(**most).warning("round 2")
    assert warning.startswith("round 2: 2 of 3 prompts (67%, above 50%) are saturated")
    for remedy in ("pofe.generate.temperature", "harder prompts", "stronger judge"):
        assert remedy in warning
