"""The SPPO seed's four-response game (`test_sppo_game.py`) played by Nash-MD-PG, sampled, through
POFE's `nash_md_mixture_logits` and `nash_md_loss`.

A tabular policy pi_theta = softmax(theta) over the responses A, B, C, D (one-token sequences,
so the per-token mixture is the sequence mixture), pi_0 uniform. Each step, for each of S games
side by side: M samples y ~ pi_theta, M opponents y' ~ pi_mix = softmax(nash_md_mixture_logits(
theta, 0, beta)), the preference P[y, y'] read off the game, and one SGD step of learning rate
LR on `nash_md_loss`. Steps: STEPS, every game from uniform.

Where Nash-MD-PG settles: the expected gradient vanishes on the support where
P(y beats pi_mix) - tau (log pi(y) - log pi_0(y)) is the same for every y, that is at

    pi(y) proportional to pi_0(y) exp(P(y beats pi_mix) / tau),   pi_mix ~ pi^(1 - beta) pi_0^beta,

the regularised game's equilibrium played against the mixture (at beta -> 0, the equilibrium of
P(pi beats pi') - tau KL(pi || pi_0) + tau KL(pi' || pi_0), exploitability 0.0509 at tau 0.1).
`regularised_equilibrium` solves it by damped fixed-point iteration, with the mixture written out
by hand (not through the functions under test): tau 0.1 gives exploitability 0.0535 at beta 0.125
(A 0.242, B 0.143, C 0.487, D 0.129) and 0.0567 at beta 0.25 (A 0.251, B 0.127, C 0.494, D 0.129).

The threshold, from the sampling noise: near that point the iterate is the linear recursion
d_{t+1} = J d_t + e_t, with J = I - LR * H (H: the Jacobian of the expected gradient, by central
differences), and e_t the step's noise, of covariance LR^2 Cov(g) / M (g: the gradient of the loss
on one pair (y, y'), its covariance exact by enumerating the 16 pairs). The stationary covariance
of theta solves C = J C J^T + Q (a Lyapunov equation), and pi's is D C D^T with D = diag(pi) - pi pi^T.
Each game's last iterate should lie within 4.5 standard deviations of the point in every response
(Gaussian: one breach in 7 * 10^4 per coordinate), the mean of the S games within 4.5 / sqrt(S),
and the exploitability, max_y (G pi)_y - 1/2, within 4.5 of the largest sd of (G pi)_y (max is
1-Lipschitz in the sup norm). Computed: |eig(J)| 0.90-0.94 per step (the transient is gone long
before STEPS), sd of pi 0.004-0.014, of the exploitability about 0.006: bands of about 0.026.

Plain self-play (beta = 0, tau = 0): no regularisation, so its fixed point is the game's Nash
equilibrium (1/7, 2/7, 4/7, 0), exploitability 0; sampled, its iterates do not settle there: they
drift toward the simplex's corners (the discrete policy gradient on a zero-sum game spirals
outward). Asserted: every game's last iterate above exploitability 0.05 (twice the regularised
runs' band) with one response at 0.85 or more.

Computed (seeds of one generator, 6 games per config): self-play's last iterates at
exploitability 0.0625-0.3616, their largest response 0.894-0.968; Nash-MD-PG's at 0.0490-0.0592
for beta 0.125 (the point: 0.0535) and 0.0540-0.0593 for beta 0.25 (0.0567), every response
within 3.6 sd of the point, the six games' means within 1.3 sd / sqrt(6). A KL term written as the
plain log-ratio tau (log pi - log pi_0) (no regularisation in expectation) fails this: both
Nash-MD-PG configs then end at exploitability 0.04-0.33 with responses at 0.58-0.99.
"""

from __future__ import annotations

import math

import torch

from pofe.losses import nash_md_loss, nash_md_mixture_logits
from tests.losses.test_sppo_game import exploitability, game

LR, M, STEPS, SEEDS = 4.0, 256, 400, 6
TAU = 0.1
# (beta, tau): plain self-play, and Nash-MD-PG at two of the paper's mixture weights
CONFIGS = ((0.0, 0.0), (0.125, TAU), (0.25, TAU))
SIGMAS = 4.5
LOG_PI_0 = torch.full((4,), math.log(0.25), dtype=torch.float64)  # pi_0 uniform
PAIRS = torch.cartesian_prod(torch.arange(4), torch.arange(4))  # (16, 2): every (y, y')


def play(configs=CONFIGS, seed: int = 0) -> torch.Tensor:
    """The last iterates pi_STEPS, (len(configs), SEEDS, 4), of SEEDS sampled games per config.

    The S games of a config are one batch: the loss is the mean over their S * M samples, so
    it is multiplied by S to give each game the gradient of the mean over its own M."""
    p = game()
    gen = torch.Generator().manual_seed(seed)
    theta = torch.zeros(len(configs), SEEDS, 4, dtype=torch.float64)
    games = torch.arange(SEEDS)[:, None]  # (S, 1)
    for _ in range(STEPS):
        theta.requires_grad_(True)
        total = 0.0
        for c, (beta, tau) in enumerate(configs):
            logp = torch.log_softmax(theta[c], dim=-1)  # (S, 4)
            mix = nash_md_mixture_logits(theta[c].detach(), LOG_PI_0.expand(SEEDS, 4), beta).exp()  # (S, 4)
            y = torch.multinomial(logp.detach().exp(), M, replacement=True, generator=gen)  # (S, M)
            y_opp = torch.multinomial(mix, M, replacement=True, generator=gen)  # (S, M)
            loss, _ = nash_md_loss(logp[games, y].flatten(), LOG_PI_0[y].flatten(), p[y, y_opp].flatten(), tau)
            total = total + SEEDS * loss
        (grad,) = torch.autograd.grad(total, theta)
        theta = (theta - LR * grad).detach()
    return theta.softmax(dim=-1)


def regularised_equilibrium(beta: float, tau: float, iterations: int = 5000) -> torch.Tensor:
    """pi = softmax(log pi_0 + G pi_mix / tau), pi_mix = pi^(1 - beta) pi_0^beta / Z, by damped
    fixed-point iteration (damping 0.1; it has stopped moving long before 5,000)."""
    p, pi = game(), LOG_PI_0.exp()
    for _ in range(iterations):
        mix = pi ** (1 - beta) * LOG_PI_0.exp() ** beta
        mix = mix / mix.sum()
        pi = 0.9 * pi + 0.1 * torch.softmax(LOG_PI_0 + p @ mix / tau, dim=-1)
    return pi


def pair_gradients(theta: torch.Tensor, beta: float, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of `nash_md_loss` on each single pair (y, y'), (16, 4), and each pair's
    probability pi(y) pi_mix(y'), (16,)."""
    p = game()
    grads = []
    for y, y_opp in PAIRS.tolist():
        th = theta.clone().requires_grad_(True)
        logp = torch.log_softmax(th, dim=-1)
        loss, _ = nash_md_loss(logp[y : y + 1], LOG_PI_0[y : y + 1], p[y, y_opp : y_opp + 1], tau)
        grads.append(torch.autograd.grad(loss, th)[0])
    weights = theta.softmax(-1)[PAIRS[:, 0]] * nash_md_mixture_logits(theta, LOG_PI_0, beta).exp()[PAIRS[:, 1]]
    return torch.stack(grads), weights


def stationary_covariance(theta: torch.Tensor, beta: float, tau: float) -> torch.Tensor:
    """pi's covariance (4, 4) around the fixed point theta under LR and M (the module docstring)."""

    def expected(t: torch.Tensor) -> torch.Tensor:
        grads, weights = pair_gradients(t, beta, tau)
        return weights @ grads

    eps = 1e-6
    basis = torch.eye(4, dtype=torch.float64)
    jac = torch.stack([(expected(theta + eps * e) - expected(theta - eps * e)) / (2 * eps) for e in basis], dim=1)
    step = basis - LR * jac
    grads, weights = pair_gradients(theta, beta, tau)
    centred = grads - weights @ grads
    noise = LR**2 * (centred.T * weights) @ centred / M
    # theta + c moves nothing (softmax): solve in the 3 directions orthogonal to the ones vector
    q, _ = torch.linalg.qr(torch.cat([torch.ones(4, 1, dtype=torch.float64), basis[:, :3]], dim=1))
    u = q[:, 1:]  # (4, 3)
    j, n = u.T @ step @ u, u.T @ noise @ u
    cov = torch.linalg.solve(torch.eye(9, dtype=torch.float64) - torch.kron(j, j), n.reshape(-1)).reshape(3, 3)
    pi = theta.softmax(-1)
    d = torch.diag(pi) - torch.outer(pi, pi)
    return d @ u @ cov @ u.T @ d.T


def test_the_regularised_point_is_where_nash_md_pg_expects_no_step():
    """At `regularised_equilibrium` the expected gradient of `nash_md_loss` (pairs enumerated) is 0
    (float64: below 1e-12), and at uniform, where the game is not at rest, it is not (above 1e-2)."""
    for beta in (0.125, 0.25):
        pi = regularised_equilibrium(beta, TAU)
        grads, weights = pair_gradients(pi.log(), beta, TAU)
        assert (weights @ grads).abs().max() < 1e-12
        grads, weights = pair_gradients(LOG_PI_0, beta, TAU)
        assert (weights @ grads).abs().max() > 1e-2


def test_nash_md_pg_last_iterate_settles_at_the_regularised_equilibrium_self_play_does_not():
    p = game()
    last = play()  # (3, SEEDS, 4)
    for c, (beta, tau) in enumerate(CONFIGS[1:], start=1):
        pi = regularised_equilibrium(beta, tau)
        cov = stationary_covariance(pi.log(), beta, tau)
        sd, sd_win = cov.diagonal().sqrt(), (p @ cov @ p.T).diagonal().sqrt()
        assert (last[c] - pi).abs().max(dim=0).values.le(SIGMAS * sd).all(), (beta, last[c], pi, sd)
        assert ((last[c].mean(0) - pi).abs() <= SIGMAS * sd / math.sqrt(SEEDS)).all(), (beta, last[c].mean(0), pi)
        gap = (exploitability(p, last[c]) - exploitability(p, pi[None])).abs()
        assert (gap <= SIGMAS * sd_win.max()).all(), (beta, exploitability(p, last[c]), exploitability(p, pi[None]))
    self_play = last[0]
    assert (exploitability(p, self_play) > 0.05).all(), exploitability(p, self_play)
    assert (self_play.max(dim=-1).values > 0.85).all(), self_play
