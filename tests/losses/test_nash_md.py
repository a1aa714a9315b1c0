"""`nash_md_mixture_logits` and `nash_md_loss` against their formulas, and the KL estimator's
expected gradient computed exactly, by enumerating a small categorical distribution."""

from __future__ import annotations

import pytest
import torch

from pofe.losses import nash_md_loss, nash_md_mixture_logits

V = 5  # outcomes of the categorical "policy": each outcome a one-token response


def _policy() -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of pi_theta and of pi_0 over V outcomes, float64, far from uniform and from each other."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(V, generator=g, dtype=torch.float64), torch.randn(V, generator=g, dtype=torch.float64)


def test_mixture_logits_are_the_normalised_geometric_mixture():
    """exp(output) = pi^(1 - beta) pi_0^beta / Z, written out with probabilities (float64, rows of
    V = 7 terms: agreement to 1e-12), for several leading shapes; beta 0 and 1 give the two models."""
    g = torch.Generator().manual_seed(1)
    policy, ref = (
        torch.randn(2, 3, 7, generator=g, dtype=torch.float64),
        torch.randn(2, 3, 7, generator=g, dtype=torch.float64),
    )
    p, q = policy.softmax(-1), ref.softmax(-1)
    for beta in (0.0, 0.125, 0.375, 1.0):
        mixed = p ** (1 - beta) * q**beta
        expected = mixed / mixed.sum(-1, keepdim=True)
        out = nash_md_mixture_logits(policy, ref, beta)
        torch.testing.assert_close(out.exp(), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(nash_md_mixture_logits(policy, ref, 0.0), policy.log_softmax(-1), rtol=0, atol=1e-12)
    assert nash_md_mixture_logits(policy.float(), ref.float(), 0.5).dtype == torch.float32
    assert nash_md_mixture_logits(policy.bfloat16(), ref.bfloat16(), 0.5).dtype == torch.float32


def test_mixture_logits_refuse_bad_input():
    x = torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"mixture_coef must be in \[0, 1\]"):
        nash_md_mixture_logits(x, x, 1.5)
    with pytest.raises(ValueError, match="ref_logits has shape"):
        nash_md_mixture_logits(x, torch.zeros(2, 5), 0.5)


def _expected_grad(theta: torch.Tensor, sample_loss) -> torch.Tensor:
    """E_{y ~ pi_theta}[grad_theta sample_loss(theta, y)]: the gradient of the loss on one sample y,
    weighted by y's probability (the sampling distribution is not differentiated), summed over y."""
    pi = theta.softmax(-1).detach()
    total = torch.zeros_like(theta)
    for y in range(V):
        th = theta.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(sample_loss(th, y), th)
        total += pi[y] * grad
    return total


def test_kl_term_has_the_kl_gradient_in_expectation_a_plain_log_ratio_has_none():
    """With P = 1/2 the loss is the KL term alone. Its gradient averaged over y ~ pi (enumerated:
    exact) equals tau grad KL(pi_theta || pi_0), the closed form differentiated by autograd
    (float64, V = 5: 1e-12). The plain term tau (log pi(y) - log pi_0(y)) averages to
    tau E[grad log pi] = tau grad sum_y pi(y) = 0, while the KL's gradient here has norm > 0.1."""
    theta, ref = _policy()
    tau = 0.7
    log_ref = ref.log_softmax(-1)

    def nash_md(th, y):
        logp = th.log_softmax(-1)
        return nash_md_loss(logp[y : y + 1], log_ref[y : y + 1], torch.tensor([0.5], dtype=th.dtype), tau)[0]

    def plain(th, y):
        return tau * (th.log_softmax(-1)[y] - log_ref[y])

    th = theta.clone().requires_grad_(True)
    kl = (th.softmax(-1) * (th.log_softmax(-1) - log_ref)).sum()
    (kl_grad,) = torch.autograd.grad(tau * kl, th)
    assert kl_grad.norm() > 0.1
    torch.testing.assert_close(_expected_grad(theta, nash_md), kl_grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(_expected_grad(theta, plain), torch.zeros(V, dtype=torch.float64), rtol=0, atol=1e-12)


def test_reinforce_term_has_the_preference_gradient_in_expectation():
    """With tau = 0 and a preference P(y) per outcome, the averaged gradient is -grad E_pi[P(y)]
    (the baseline 1/2 adds 1/2 E[grad log pi] = 0): the loss descends where the win rate rises."""
    theta, ref = _policy()
    preference = torch.tensor([0.9, 0.2, 0.5, 0.65, 0.0], dtype=torch.float64)

    def nash_md(th, y):
        logp = th.log_softmax(-1)
        return nash_md_loss(logp[y : y + 1], ref.log_softmax(-1)[y : y + 1], preference[y : y + 1], 0.0)[0]

    th = theta.clone().requires_grad_(True)
    (win_grad,) = torch.autograd.grad((th.softmax(-1) * preference).sum(), th)
    torch.testing.assert_close(_expected_grad(theta, nash_md), -win_grad, rtol=0, atol=1e-12)


def test_loss_and_stats_on_a_worked_example():
    """logps (-1, -2), pi_0's (-1.5, -1), P (1, 1/4), tau 0.1:
    L_1 = -(1/2)(-1) + 0.1 (0.5)(-1) = 0.45, L_2 = -(-1/4)(-2) + 0.1 (-1)(-2) = -0.3, mean 0.075;
    gradient w.r.t. logps: (-(1/2) + 0.05, 1/4 - 0.1) / 2 = (-0.225, 0.075). Stats: mean P 0.625,
    mean log-ratio (0.5 - 1) / 2 = -0.25, mean logp -1.5; 0-dim tensors without gradient."""
    logps = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    loss, stats = nash_md_loss(logps, torch.tensor([-1.5, -1.0]), torch.tensor([1.0, 0.25]), 0.1)
    assert loss.item() == pytest.approx(0.075, abs=1e-15)
    (grad,) = torch.autograd.grad(loss, logps)
    torch.testing.assert_close(grad, torch.tensor([-0.225, 0.075], dtype=torch.float64), rtol=0, atol=1e-15)
    expected = {"loss": 0.075, "preference": 0.625, "kl": -0.25, "logp": -1.5}
    assert set(stats) == set(expected)
    for name, value in expected.items():
        assert stats[name].dim() == 0 and not stats[name].requires_grad
        assert stats[name].item() == pytest.approx(value, abs=1e-15), name


def test_loss_refuses_bad_input():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match=r"preference must lie in \[0, 1\]"):
        nash_md_loss(x, x, torch.tensor([0.5, 1.5, 0.0]), 0.1)
    with pytest.raises(ValueError, match=r"pi_0_logps must have the shape of logps \(3,\), got \(2,\)"):
        nash_md_loss(x, torch.zeros(2), x, 0.1)
    with pytest.raises(ValueError, match=r"preference must have the shape of logps \(3,\), got \(3, 1\)"):
        nash_md_loss(x, x, torch.zeros(3, 1), 0.1)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        nash_md_loss(x, x, x, 0.1, mask=torch.ones(3))
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        nash_md_loss(x, x, x, -0.1)
    with pytest.raises(ValueError, match="at least one real sample"):
        nash_md_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0), 0.1)
    with pytest.raises(ValueError, match="at least one real sample"):
        nash_md_loss(x, x, x, 0.1, mask=torch.zeros(3, dtype=torch.bool))
    # a padded slot's preference is not checked, a real one's is
    padded = torch.tensor([0.5, 7.0, 0.0])
    nash_md_loss(x, x, padded, 0.1, mask=torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match=r"got \[0.5, 7.0\]"):
        nash_md_loss(x, x, padded, 0.1, mask=torch.tensor([True, True, False]))


def test_a_masked_batch_is_the_loss_of_its_real_samples():
    """(B, K) = (2, 3) with two padded slots holding NaN: the loss, its gradient and the stats
    equal those of the four real samples passed as (N,) (the worked example's pair twice over:
    loss 0.075), and the padded slots get exactly zero gradient (each real slot's gradient is
    the same few operations either way: equal to the bit)."""
    nan = float("nan")
    logps = torch.tensor([[-1.0, -2.0, nan], [-1.0, nan, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, nan], [-1.5, nan, -1.0]])
    preference = torch.tensor([[1.0, 0.25, nan], [1.0, nan, 0.25]])
    mask = ~torch.isnan(ref)
    loss, stats = nash_md_loss(logps, ref, preference, 0.1, mask=mask)
    flat = torch.tensor([-1.0, -2.0, -1.0, -2.0], dtype=torch.float64, requires_grad=True)
    flat_loss, flat_stats = nash_md_loss(flat, ref[mask], preference[mask], 0.1)
    # sums of four float64 terms below 1 in another order: a few ulp of 1 apart at most
    assert loss.item() == pytest.approx(flat_loss.item(), abs=1e-15)
    assert loss.item() == pytest.approx(0.075, abs=1e-15)
    (grad,) = torch.autograd.grad(loss, logps)
    (flat_grad,) = torch.autograd.grad(flat_loss, flat)
    torch.testing.assert_close(grad[mask], flat_grad, rtol=0, atol=0)
    assert grad[~mask].tolist() == [0.0, 0.0]
    assert {k: v.item() for k, v in stats.items()} == pytest.approx(
        {k: v.item() for k, v in flat_stats.items()}, abs=1e-15
    )
