"""Tests for pofe.losses: hand-worked numbers and naive loop references."""

from __future__ import annotations

import math

import pytest
import torch

from pofe.losses import mixed_anchor, rrhf_loss, sppo_hard_loss, sppo_loss


# ---------------------------------------------------------------- naive references
def naive_rrhf(logp, lengths, rewards, rank_weight=1.0, margin=0.0, length_penalty=1.0):
    """Plain-Python RRHF for ONE prompt (lists of floats), straight from the paper."""
    p = [lp / n**length_penalty for lp, n in zip(logp, lengths)]
    k = len(p)
    rank = 0.0
    for i in range(k):
        for j in range(k):
            if rewards[i] < rewards[j]:
                rank += max(0.0, p[i] - p[j] + margin)
    best = 0
    for i in range(1, k):
        if rewards[i] > rewards[best]:
            best = i
    return rank_weight * rank - logp[best]


def naive_sppo(logp, anchor, win, eta):
    """Plain-Python per-response SPPO losses for one prompt."""
    return [(lp - a - eta * (w - 0.5)) ** 2 for lp, a, w in zip(logp, anchor, win)]


# ---------------------------------------------------------------- RRHF
def _example():
    """k=3: logp_sum [-2, -8, -9], lengths [2, 4, 3], rewards [0, 2, 1]."""
    return (
        torch.tensor([-2.0, -8.0, -9.0], requires_grad=True),
        torch.tensor([2, 4, 3]),
        torch.tensor([0.0, 2.0, 1.0]),
    )


def test_rrhf_worked_example():
    """p = [-2/2, -8/4, -9/3] = [-1, -2, -3]. Reward order r0 < r2 < r1.

    Pairs (worse i, better j): (0,1): relu(-1+2)=1; (0,2): relu(-1+3)=2;
    (2,1): relu(-3+2)=0. L_rank = 3. Best b = 1: L_ft = 8. Loss = 11.
    rank_accuracy: only (2,1) has p_i < p_j -> 1/3. best_score = p_1 = -2;
    other_score = mean(-1, -3) = -2.
    """
    logp, n, r = _example()
    loss, stats = rrhf_loss(logp, n, r)
    assert loss.item() == pytest.approx(11.0)
    assert float(stats["rank"]) == pytest.approx(3.0)
    assert float(stats["ft"]) == pytest.approx(8.0)
    assert float(stats["rank_accuracy"]) == pytest.approx(1 / 3)
    assert float(stats["best_score"]) == pytest.approx(-2.0)
    assert float(stats["other_score"]) == pytest.approx(-2.0)
    # 0-dim tensors, detached: the trainer reads them once per logging step (issue 42)
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())


def test_rrhf_hand_gradient():
    """dL/dp = [+1 (pair 01) +1 (pair 02), -1 (pair 01), -1 (pair 02)] = [2, -1, -1].

    dL/dlogp_i = dL/dp_i / n_i, plus -1 on the best (index 1):
    [2/2, -1/4 - 1, -1/3] = [1, -1.25, -1/3].
    """
    logp, n, r = _example()
    rrhf_loss(logp, n, r)[0].backward()
    torch.testing.assert_close(logp.grad, torch.tensor([1.0, -1.25, -1 / 3]))


def test_rrhf_margin():
    """margin 1.5 on the worked example: 2.5 + 3.5 + relu(-1 + 1.5) = 6.5; loss 14.5."""
    logp, n, r = _example()
    loss, stats = rrhf_loss(logp, n, r, margin=1.5)
    assert float(stats["rank"]) == pytest.approx(6.5)
    assert loss.item() == pytest.approx(14.5)


def test_rrhf_rank_weight():
    """rank_weight 0.5: 0.5 * 3 + 8 = 9.5."""
    logp, n, r = _example()
    assert rrhf_loss(logp, n, r, rank_weight=0.5)[0].item() == pytest.approx(9.5)


@pytest.mark.parametrize("length_penalty, rank", [(0.0, 5.0), (1.0, 0.5), (2.0, 0.0)])
def test_rrhf_length_penalty(length_penalty, rank):
    """logp_sum [-8, -3], lengths [4, 2], rewards [1, 0]: pair (1 worse, 0 better).

    lp 0: p = [-8, -3]       -> relu(-3 + 8)       = 5   (summed logp favours the short one)
    lp 1: p = [-2, -1.5]     -> relu(-1.5 + 2)     = 0.5
    lp 2: p = [-0.5, -0.75]  -> relu(-0.75 + 0.5)  = 0
    L_ft = 8 in every case.
    """
    loss, stats = rrhf_loss(
        torch.tensor([-8.0, -3.0]), torch.tensor([4, 2]), torch.tensor([1.0, 0.0]), length_penalty=length_penalty
    )
    assert float(stats["rank"]) == pytest.approx(rank)
    assert loss.item() == pytest.approx(rank + 8.0)


def test_rrhf_ties():
    """logp [-3, -1, -2], lengths 1, rewards [1, 1, 0].

    Tied pair (0, 1) contributes nothing (else relu(-1 + 3) = 2 would appear).
    (2, 0): relu(-2 + 3) = 1; (2, 1): relu(-2 + 1) = 0 -> L_rank = 1.
    Tie for best goes to the first index 0: L_ft = 3. Loss = 4.
    Pairs: 2, correct (p_i < p_j): (2, 1) only -> accuracy 0.5.
    """
    loss, stats = rrhf_loss(torch.tensor([-3.0, -1.0, -2.0]), torch.ones(3), torch.tensor([1.0, 1.0, 0.0]))
    assert loss.item() == pytest.approx(4.0)
    assert float(stats["ft"]) == pytest.approx(3.0)
    assert float(stats["rank_accuracy"]) == pytest.approx(0.5)


def test_rrhf_all_tied_has_no_pairs():
    """All rewards equal: L_rank = 0, rank_accuracy NaN, best = index 0 (L_ft = 3)."""
    loss, stats = rrhf_loss(torch.tensor([-3.0, -1.0]), torch.ones(2), torch.zeros(2))
    assert loss.item() == pytest.approx(3.0)
    assert math.isnan(stats["rank_accuracy"])


def test_rrhf_mask_padding_changes_nothing():
    """Row 1 has 2 real candidates and a padded slot full of NaN/inf/0."""
    a = torch.tensor([-2.0, -8.0, -9.0])
    b = torch.tensor([-5.0, -1.0])
    padded = torch.stack([a, torch.cat([b, torch.tensor([float("nan")])])]).requires_grad_()
    lengths = torch.tensor([[2.0, 4.0, 3.0], [5.0, 2.0, 0.0]])
    rewards = torch.tensor([[0.0, 2.0, 1.0], [3.0, -1.0, float("nan")]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    loss, stats = rrhf_loss(padded, lengths, rewards, mask=mask)
    loss.backward()

    la, _ = rrhf_loss(a, lengths[0], rewards[0])
    lb, _ = rrhf_loss(b, lengths[1, :2], rewards[1, :2])
    torch.testing.assert_close(loss, (la + lb) / 2)
    assert padded.grad[1, 2].item() == 0.0
    assert torch.isfinite(padded.grad).all()
    assert all(not math.isnan(v) for v in stats.values())

    # inf in the padded slot instead of NaN: identical loss.
    inf_logp = padded.detach().clone()
    inf_logp[1, 2] = float("-inf")
    rewards_inf = rewards.clone()
    rewards_inf[1, 2] = float("inf")
    torch.testing.assert_close(rrhf_loss(inf_logp, lengths, rewards_inf, mask=mask)[0], loss.detach())


def test_rrhf_batch_equals_mean_of_rows():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 5, generator=g) * 20
    lengths = torch.randint(1, 30, (4, 5), generator=g)
    rewards = torch.randint(0, 3, (4, 5), generator=g).float()  # with ties
    batch, _ = rrhf_loss(logp, lengths, rewards, margin=0.1)
    rows = torch.stack([rrhf_loss(logp[i], lengths[i], rewards[i], margin=0.1)[0] for i in range(4)])
    torch.testing.assert_close(batch, rows.mean())


@pytest.mark.parametrize("seed", range(5))
def test_rrhf_matches_naive_reference(seed):
    g = torch.Generator().manual_seed(seed)
    B, k = 3, 6
    logp = -torch.rand(B, k, generator=g, dtype=torch.float64) * 50
    lengths = torch.randint(1, 40, (B, k), generator=g)
    rewards = torch.randint(0, 4, (B, k), generator=g).double()
    kw = dict(rank_weight=0.7, margin=0.05, length_penalty=1.3)
    loss, _ = rrhf_loss(logp, lengths, rewards, **kw)
    ref = sum(naive_rrhf(logp[b].tolist(), lengths[b].tolist(), rewards[b].tolist(), **kw) for b in range(B)) / B
    assert loss.item() == pytest.approx(ref, rel=1e-12)


def test_rrhf_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(2, 4, generator=g, dtype=torch.float64) * 10).requires_grad_()
    lengths = torch.randint(1, 10, (2, 4), generator=g)
    rewards = torch.randn(2, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])
    assert torch.autograd.gradcheck(lambda x: rrhf_loss(x, lengths, rewards, mask=mask, margin=0.01)[0], (logp,))


def test_rrhf_bf16_close_to_float32():
    g = torch.Generator().manual_seed(2)
    logp32 = -torch.rand(2, 4, generator=g) * 30
    lengths = torch.randint(5, 30, (2, 4), generator=g)
    rewards = torch.randn(2, 4, generator=g)
    logp16 = logp32.bfloat16().requires_grad_()
    loss16, _ = rrhf_loss(logp16, lengths, rewards.bfloat16())
    loss16.backward()
    assert loss16.dtype == torch.float32 and logp16.grad.dtype == torch.bfloat16
    # Upcast inside: bf16 input equals float32 on the same (rounded) values exactly ...
    exact, _ = rrhf_loss(logp16.detach().float(), lengths, rewards.bfloat16().float())
    torch.testing.assert_close(loss16.detach(), exact)
    # ... and is close to the unrounded float32 loss.
    loss32, _ = rrhf_loss(logp32, lengths, rewards)
    torch.testing.assert_close(loss16.detach(), loss32, rtol=2e-2, atol=0.1)


def test_rrhf_rejects_bad_input():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="lengths"):
        rrhf_loss(x, torch.ones(4), x)
    with pytest.raises(ValueError, match="rewards"):
        rrhf_loss(x, torch.ones(3), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="logp_sum"):
        rrhf_loss(torch.zeros(1, 1, 3), torch.ones(1, 1, 3), torch.zeros(1, 1, 3))
    with pytest.raises(ValueError, match="mask"):
        rrhf_loss(x, torch.ones(3), x, mask=torch.ones(3))
    with pytest.raises(ValueError, match="mask"):
        rrhf_loss(x, torch.ones(3), x, mask=torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="margin"):
        rrhf_loss(x, torch.ones(3), x, margin=-1.0)
    with pytest.raises(ValueError, match="lengths"):
        rrhf_loss(x, torch.tensor([1.0, 0.0, 1.0]), x)


# ---------------------------------------------------------------- SPPO
def _sppo_example():
    """logp [-10, -12, -11], anchor [-10.5, -11, -11], w [0.75, 0.125, 0.5], eta 4."""
    return (
        torch.tensor([-10.0, -12.0, -11.0], requires_grad=True),
        torch.tensor([-10.5, -11.0, -11.0]),
        torch.tensor([0.75, 0.125, 0.5]),
    )


def test_sppo_worked_example():
    """logratio = [0.5, -1, 0]; target = 4 * (w - 0.5) = [1, -1.5, 0].

    Residuals [-0.5, 0.5, 0] -> squares [0.25, 0.25, 0]: sum 0.5, mean 1/6.
    Stats: logratio mean -1/6, target mean -1/6, spread 0.75 - 0.125 = 0.625.
    """
    logp, anchor, w = _sppo_example()
    loss, stats = sppo_loss(logp, anchor, w, eta=4.0)
    assert loss.item() == pytest.approx(1 / 6)
    assert sppo_loss(logp, anchor, w, eta=4.0, reduction="sum")[0].item() == pytest.approx(0.5)
    assert float(stats["loss"]) == pytest.approx(1 / 6)
    assert float(stats["logratio"]) == pytest.approx(-1 / 6)
    assert float(stats["target"]) == pytest.approx(-1 / 6)
    assert float(stats["win_rate_spread"]) == pytest.approx(0.625)


def test_sppo_gradient():
    """Mean reduction: dL/dlogp_i = 2 (logratio_i - target_i) / K = [-1/3, 1/3, 0]."""
    logp, anchor, w = _sppo_example()
    sppo_loss(logp, anchor, w, eta=4.0)[0].backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-1 / 3, 1 / 3, 0.0]))


def test_sppo_matches_naive_and_mask():
    """Batch of 2 prompts, the second with a padded slot full of NaN."""
    logp = torch.tensor([[-10.0, -12.0, -11.0], [-3.0, -4.0, float("nan")]], requires_grad=True)
    anchor = torch.tensor([[-10.5, -11.0, -11.0], [-3.5, -3.0, float("nan")]])
    w = torch.tensor([[0.75, 0.125, 0.5], [0.6, 0.4, float("nan")]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    loss, stats = sppo_loss(logp, anchor, w, eta=4.0, mask=mask)
    loss.backward()
    terms = naive_sppo([-10, -12, -11], [-10.5, -11, -11], [0.75, 0.125, 0.5], 4.0)
    terms += naive_sppo([-3, -4], [-3.5, -3], [0.6, 0.4], 4.0)
    assert loss.item() == pytest.approx(sum(terms) / 5)
    assert logp.grad[1, 2].item() == 0.0 and torch.isfinite(logp.grad).all()
    assert float(stats["win_rate_spread"]) == pytest.approx((0.625 + 0.2) / 2)


def test_sppo_hard_worked_example():
    """beta 0.25 -> 1/(2 beta) = 2. a = [1, 3], b = [-1, 0].

    Pair 1: (1-2)^2 + (-1+2)^2 = 2; pair 2: (3-2)^2 + (0+2)^2 = 5. Mean 3.5.
    Accuracy: a > b in both pairs -> 1.
    """
    zeros = torch.zeros(2)
    loss, stats = sppo_hard_loss(torch.tensor([1.0, 3.0]), zeros, torch.tensor([-1.0, 0.0]), zeros, beta=0.25)
    assert loss.item() == pytest.approx(3.5)
    assert float(stats["accuracy"]) == 1.0
    assert float(stats["chosen_logratio"]) == pytest.approx(2.0)
    assert float(stats["rejected_logratio"]) == pytest.approx(-0.5)


def test_sppo_soft_with_hard_labels_is_half_the_hard_loss():
    """Win rates (1, 0), eta = 1/beta: soft averages 2 responses, hard sums them."""
    g = torch.Generator().manual_seed(3)
    c, ca, r, ra = (torch.randn(6, generator=g, dtype=torch.float64) * 5 for _ in range(4))
    beta = 0.01
    hard, _ = sppo_hard_loss(c, ca, r, ra, beta=beta)
    win = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(6, 2)
    soft, _ = sppo_loss(torch.stack([c, r], 1), torch.stack([ca, ra], 1), win, eta=1 / beta)
    torch.testing.assert_close(soft, hard / 2)


def test_sppo_bad_args_raise():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="reduction"):
        sppo_loss(x, x, x, reduction="none")
    with pytest.raises(ValueError, match="eta"):
        sppo_loss(x, x, x, eta=0.0)
    with pytest.raises(ValueError, match="win_rate"):
        sppo_loss(x, x, torch.zeros(4))
    with pytest.raises(ValueError, match="beta"):
        sppo_hard_loss(x, x, x, x, beta=0.0)
    with pytest.raises(ValueError, match="rejected_logp"):
        sppo_hard_loss(x, x, torch.zeros(2), x)


# ---------------------------------------------------------------- SPPO's anchor mixed toward pi_0
def test_mixed_anchor_worked_example():
    """beta 0.25: anchor [-2, -4], base [-1, -8] -> 0.75 * anchor + 0.25 * base = [-1.75, -5];
    beta 1 is the base itself. Through sppo_loss (eta 4, w = [0.75, 0.25], logp [-1, -6]):
    logratio to the mixed anchor [0.75, -1], target [1, -1], residuals [-0.25, 0]: mean 1/32."""
    anchor, base = torch.tensor([-2.0, -4.0]), torch.tensor([-1.0, -8.0])
    mixed = mixed_anchor(anchor, base, 0.25)
    torch.testing.assert_close(mixed, torch.tensor([-1.75, -5.0]))
    torch.testing.assert_close(mixed_anchor(anchor, base, 1.0), base)
    loss, _ = sppo_loss(torch.tensor([-1.0, -6.0]), mixed, torch.tensor([0.75, 0.25]), eta=4.0)
    assert loss.item() == pytest.approx(1 / 32)


def test_mixed_anchor_beta_0_is_the_paper_and_reads_no_base():
    """beta 0 returns the anchor itself, even where the base is NaN (a row never scored under
    pi_0); a positive beta carries a NaN base into that slot, for the loss's mask to drop."""
    anchor = torch.tensor([[-2.0, -3.0]])
    base = torch.tensor([[float("nan"), -1.0]])
    assert mixed_anchor(anchor, base, 0.0) is anchor
    assert torch.isnan(mixed_anchor(anchor, base, 0.5)[0, 0])
    loss, _ = sppo_loss(
        torch.tensor([[-2.0, -1.0]]),
        mixed_anchor(anchor, base, 0.5),
        torch.tensor([[0.5, 0.5]]),
        mask=torch.tensor([[False, True]]),
    )
    assert loss.item() == pytest.approx((-1.0 - (0.5 * -3.0 + 0.5 * -1.0)) ** 2)


def test_mixed_anchor_bad_args_raise():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="beta"):
        mixed_anchor(x, x, 1.5)
    with pytest.raises(ValueError, match="beta"):
        mixed_anchor(x, x, -0.1)
    with pytest.raises(ValueError, match="pi_0_logps has shape"):
        mixed_anchor(x, torch.zeros(2, 4), 0.1)
