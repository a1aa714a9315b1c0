"""Length-controlled win rates: did a model win by being better, or only by being longer?

AlpacaEval 2's method, simplified to one comparison: a logistic regression of the judge's
preference for model A's response over model B's on their length difference,

    P(A wins | d) = sigmoid(a + b * f(d)),   f(d) = tanh(d / s),

d = tokens(A's response) - tokens(B's), s = the standard deviation of d over the comparisons
(f = 0 when every d is equal). The length-controlled win rate is sigmoid(a): the win rate the
fit predicts at zero length difference; the raw win rate is the mean preference. A judge
indifferent to length gives b ~ 0 and sigmoid(a) ~ the raw rate; a judge that prefers the
longer answer and nothing else gives sigmoid(a) ~ 1/2 whatever the raw rate.

The fit maximises the soft-label log-likelihood (preferences in [0, 1]: Bradley-Terry
probabilities or a pairwise judge's ties) minus ridge/2 * b^2, by Newton's method with step
halving: deterministic, and finite when length separates the verdicts perfectly. NaN
preferences (abstentions) are left out. Torch only; no model code.
"""

from __future__ import annotations

import torch
from torch import Tensor

RIDGE = 1e-3  # on the slope only: keeps it finite under perfect separation, ~no effect otherwise


def _objective(x: Tensor, y: Tensor, theta: Tensor, ridge: float) -> Tensor:
    z = theta[0] + theta[1] * x
    # y log sigmoid(z) + (1 - y) log sigmoid(-z)
    ll = y * torch.nn.functional.logsigmoid(z) + (1 - y) * torch.nn.functional.logsigmoid(-z)
    return ll.sum() - 0.5 * ridge * theta[1] ** 2


def fit_length_logistic(pref: Tensor, len_diff: Tensor, ridge: float = RIDGE, iters: int = 100) -> dict:
    """Fit P(win) = sigmoid(a + b * tanh(d / s)) to preferences.

    Args:
        pref: (N,) preference of A's response over B's, in [0, 1]; NaN = no verdict.
        len_diff: (N,) tokens of A's response minus tokens of B's.
    Returns:
        {"raw": mean preference, "lc": sigmoid(a), "a", "b", "scale": s, "n": comparisons};
        raw and lc are None without any verdict.
    """
    y, d = pref.reshape(-1).double(), len_diff.reshape(-1).double()
    keep = ~torch.isnan(y)
    y, d = y[keep], d[keep]
    n = int(y.numel())
    if n == 0:
        return {"raw": None, "lc": None, "a": None, "b": None, "scale": None, "n": 0}
    scale = float(d.std(correction=0))
    x = torch.tanh(d / scale) if scale > 0 else torch.zeros_like(d)
    X = torch.stack([torch.ones_like(x), x], dim=1)  # (N, 2)
    penalty = torch.tensor([[0.0, 0.0], [0.0, ridge]], dtype=torch.float64)
    theta = torch.zeros(2, dtype=torch.float64)
    # a raw rate of exactly 0 or 1 has no finite intercept: clamp the labels a hair inside
    y = y.clamp(1e-9, 1 - 1e-9)
    best = _objective(x, y, theta, ridge)
    for _ in range(iters):
        p = torch.sigmoid(X @ theta)
        grad = X.T @ (y - p) - penalty @ theta
        hess = X.T @ (X * (p * (1 - p)).unsqueeze(1)) + penalty + 1e-12 * torch.eye(2, dtype=torch.float64)
        step = torch.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-8:  # step halving: the objective never falls
            value = _objective(x, y, theta + t * step, ridge)
            if value >= best:
                break
            t /= 2
        else:
            break
        theta, best = theta + t * step, value
        if float((t * step).abs().max()) < 1e-10:
            break
    a, b = float(theta[0]), float(theta[1])
    return {"raw": float(y.mean()), "lc": float(torch.sigmoid(theta[0])), "a": a, "b": b, "scale": scale, "n": n}


def pair_observations(pref: Tensor, tokens: Tensor, a: int, b: int) -> tuple[Tensor, Tensor]:
    """Model a's responses against model b's, per prompt, as (preference, length difference).

    Args:
        pref: (P, M*S, M*S) preference matrices, responses model-major (model m's samples
            are m*S .. m*S+S-1), pref[p, i, j] = P(response i beats response j).
        tokens: (P, M, S) response lengths in tokens.
    Returns:
        ((P, S*S), (P, S*S)): pref[p, a's s, b's s'] and tokens[p, a, s] - tokens[p, b, s'].
    """
    P, M, S = tokens.shape
    blocks = pref.reshape(P, M, S, M, S)[:, a, :, b, :]  # (P, S, S)
    diff = tokens[:, a, :, None].double() - tokens[:, b, None, :].double()  # (P, S, S)
    return blocks.reshape(P, S * S), diff.reshape(P, S * S)
