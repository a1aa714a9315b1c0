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
preferences (abstentions) are left out. NumPy for the fit (small arrays: little overhead per
step), torch in `pair_observations`; no model code.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

RIDGE = 1e-3  # on the slope only: keeps it finite under perfect separation, ~no effect otherwise


def _objective(x: np.ndarray, y: np.ndarray, a: float, b: float, ridge: float) -> float:
    z = a + b * x
    # y log sigmoid(z) + (1 - y) log sigmoid(-z), with log sigmoid(z) = -log(1 + e^-z)
    return float(-(y * np.logaddexp(0.0, -z) + (1 - y) * np.logaddexp(0.0, z)).sum() - 0.5 * ridge * b * b)


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for large |z|


def fit_length_logistic(pref, len_diff, ridge: float = RIDGE, iters: int = 100) -> dict:
    """Fit P(win) = sigmoid(a + b * tanh(d / s)) to preferences.

    Args:
        pref: (N,) tensor or array, preference of A's response over B's, in [0, 1]; NaN =
            no verdict.
        len_diff: (N,) tokens of A's response minus tokens of B's.
    Returns:
        {"raw": mean preference, "lc": sigmoid(a), "a", "b", "scale": s, "n": comparisons};
        raw and lc are None without any verdict.
    """
    y = np.asarray(pref, dtype=np.float64).reshape(-1)
    d = np.asarray(len_diff, dtype=np.float64).reshape(-1)
    keep = ~np.isnan(y)
    y, d = y[keep], d[keep]
    n = int(y.size)
    if n == 0:
        return {"raw": None, "lc": None, "a": None, "b": None, "scale": None, "n": 0}
    scale = float(d.std())
    x = np.tanh(d / scale) if scale > 0 else np.zeros_like(d)
    raw = float(y.mean())
    # a raw rate of exactly 0 or 1 has no finite intercept: clamp the labels a hair inside
    y = np.clip(y, 1e-9, 1 - 1e-9)
    a = b = 0.0
    best = _objective(x, y, a, b, ridge)
    for _ in range(iters):
        p = _sigmoid(a + b * x)
        r, w = y - p, p * (1 - p)
        ga, gb = float(r.sum()), float((r * x).sum()) - ridge * b
        haa, hab, hbb = float(w.sum()) + 1e-12, float((w * x).sum()), float((w * x * x).sum()) + ridge + 1e-12
        det = haa * hbb - hab * hab
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det  # Newton: H^-1 g for the 2 x 2 H
        t = 1.0
        while t > 1e-8:  # step halving: the objective never falls
            value = _objective(x, y, a + t * da, b + t * db, ridge)
            if value >= best:
                break
            t /= 2
        else:
            break
        a, b, best = a + t * da, b + t * db, value
        if max(abs(t * da), abs(t * db)) < 1e-10:
            break
    return {"raw": raw, "lc": float(_sigmoid(a)), "a": a, "b": b, "scale": scale, "n": n}


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
