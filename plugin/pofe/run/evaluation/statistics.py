"""Evaluation's statistics: the win-rate matrix and its cycles, length-controlled win rates,
bootstrap intervals, and the comparisons between iterates eval.json reports.

The win-rate matrix. W[a, b] = P(a's response beats b's), averaged over prompts and over all sample pairs.
Scalar judges give W through Bradley-Terry on the rewards, sigmoid(r_a - r_b); pairwise
judges give it directly, from the judge's preference matrix over all models' responses.

Cycles: "a beats b" means W[a, b] > threshold (0.5 by default; `pofe.eval.cycle_threshold`
raises it to ignore noise). `find_cycles` lists every 3-cycle a > b > c > a. A tournament
(every pair decided) is intransitive iff it holds a 3-cycle, so 3-cycles are enough to
flag any cycle there.

Length-controlled win rates: did a model win by being better, or only by being longer?
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

Bootstrap 95 % intervals over prompts (seeded, deterministic). A win rate is a mean over prompts of per-prompt win rates; its interval resamples the
prompts with replacement (`draws` times, from `torch.Generator().manual_seed(seed)`), takes
the statistic of each resample, and reports the 2.5 % and 97.5 % quantiles (the percentile
bootstrap). Samples within a prompt stay together: they share the prompt's difficulty.
An interval needs at least `MIN_INTERVAL_PROMPTS` (6) prompts with a verdict: below that no
interval is reported (None, eval.json's null), and nothing is "clearly" better or worse
(`pofe.run.evaluation.decision`). Six, because with fewer prompts even a unanimous result is
no evidence at the intervals' 95 %: a coin decides all of n prompts alike with probability
2 * 2^-n, above 5 % for n <= 5 (one prompt always gives an interval of width 0).

The comparisons between iterates (`compare_iterates`). From the judge's response preferences on the held-out prompts (any judge: a pairwise
judge's own, a scalar judge's through Bradley-Terry, `pofe.run.evaluation.judging`) and the answers'
lengths in tokens, eval.json's

- `win_matrix_ci95`: [M][M][lower, upper], a bootstrap 95 % interval over prompts of each
  W[a, b];
- `vs_pi_0` and `vs_previous`: per model (None for pi_0), its raw win rate against pi_0 and
  against the iterate before it (W[t, 0], W[t, t-1]) beside the length-controlled one, each
  with its interval, and the fitted length slope;
- `response_tokens`: each model's mean and median answer length.

With a scalar judge (a reward model, a verifier, reward functions), the rewards themselves
(`reward_comparisons`): each model's mean held-out reward with its interval, and its paired
difference to pi_0 and to the iterate before it, resampling the same prompts for both models.
That is what the choice of a model reads then (`pofe.run.evaluation.decision`): Bradley-Terry
win rates over rewards in [0, 1] stay within 0.27-0.73 by construction and carry the sign of a
reward gap, not its size.
"""

from __future__ import annotations

import statistics

import numpy as np
import torch
from torch import Tensor

from pofe_candidates.win_rates import bradley_terry_preferences


def block_win_matrix(pref: Tensor, num_models: int, num_samples: int) -> Tensor:
    """Average a preference matrix over all responses into a model-vs-model matrix.

    Args:
        pref: (P, M*S, M*S), pref[p, i, j] = P(response i beats response j) for prompt p;
            responses are ordered model-major (model m's samples are m*S .. m*S+S-1).
            NaN entries (abstentions) are left out of the averages.
    Returns:
        (M, M): W[a, b] = mean over prompts and sample pairs of P(a's beats b's);
        the diagonal is exactly 1/2.
    """
    w = torch.nanmean(per_prompt_win_matrix(pref, num_models, num_samples), dim=0)  # (M, M)
    w.fill_diagonal_(0.5)
    return w


def per_prompt_win_matrix(pref: Tensor, num_models: int, num_samples: int) -> Tensor:
    """(P, M*S, M*S) response preferences (as `block_win_matrix`) -> (P, M, M): on each
    prompt, the mean over sample pairs of P(a's beats b's), NaN left out."""
    P, N, _ = pref.shape
    M, S = num_models, num_samples
    if N != M * S:
        raise ValueError(f"pref is {tuple(pref.shape)}, expected (P, {M * S}, {M * S})")
    return torch.nanmean(pref.reshape(P, M, S, M, S), dim=(2, 4))  # (P, M, M)


def win_matrix_from_rewards(rewards: Tensor) -> Tensor:
    """Bradley-Terry win rates between models from scalar rewards.

    Args:
        rewards: (P, M, S) reward of model m's sample s on prompt p (NaN = abstained).
    Returns:
        (M, M), W[a, b] = mean_{p, s, s'} sigmoid(r[p, a, s] - r[p, b, s']), diagonal 1/2.
    """
    P, M, S = rewards.shape
    pref = bradley_terry_preferences(rewards.reshape(P, M * S).double())  # (P, M*S, M*S)
    return block_win_matrix(pref, M, S)


def find_cycles(win_matrix, threshold: float = 0.5) -> list[tuple[int, int, int]]:
    """All 3-cycles of the "beats" relation of a win-rate matrix.

    Args:
        win_matrix: (M, M) tensor or nested list, win_matrix[a][b] = P(a beats b).
        threshold: a beats b when win_matrix[a][b] > threshold (strictly: 0.5 is a tie).
    Returns:
        [(a, b, c), ...]: a beats b, b beats c and c beats a; each cycle once, rotated
        so that a is its smallest index; sorted.
    """
    w = win_matrix.tolist() if hasattr(win_matrix, "tolist") else [list(r) for r in win_matrix]
    m = len(w)
    if any(len(r) != m for r in w):
        raise ValueError(f"win_matrix must be square, got {m} rows of lengths {[len(r) for r in w]}")
    beats = [[a != b and w[a][b] is not None and w[a][b] > threshold for b in range(m)] for a in range(m)]
    cycles = []
    for a in range(m):
        for b in range(a + 1, m):
            for c in range(a + 1, m):
                if b != c and beats[a][b] and beats[b][c] and beats[c][a]:
                    cycles.append((a, b, c))
    return sorted(cycles)


RIDGE = 1e-3  # on the slope only: keeps it finite under perfect separation, ~no effect otherwise


def distance_from_half(win_matrix) -> float:
    """max |W[a, b] - 1/2| over the pairs of distinct models of an (M, M) list or tensor; 0 for
    one model. Small: every win rate clusters at 1/2 (Bradley-Terry over close rewards, or a
    judge that tells the models apart rarely)."""
    w = torch.as_tensor(win_matrix, dtype=torch.float64)
    off_diagonal = w[~torch.eye(len(w), dtype=torch.bool)]
    return float((off_diagonal - 0.5).abs().max()) if off_diagonal.numel() else 0.0


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


LEVEL, DRAWS, LC_DRAWS = 0.95, 1000, 200  # a length-controlled rate refits per draw: fewer
# the fewest prompts an interval is computed from (the module's docstring says why)
MIN_INTERVAL_PROMPTS = 6


def too_few_prompts(n: int, minimum: int = MIN_INTERVAL_PROMPTS) -> str | None:
    """Why `n` prompts give no interval ("too few prompts (1) for an interval (at least 6: ...)"),
    None when they are enough."""
    if n >= minimum:
        return None
    return f"too few prompts ({n}) for an interval (at least {minimum}: raise pofe.eval.held_out)"


def prompt_resamples(num_prompts: int, draws: int, seed: int) -> Tensor:
    """(draws, P) prompt indices, each row P draws with replacement."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_prompts, (draws, num_prompts), generator=g)


def percentile_interval(values: Tensor, level: float = LEVEL) -> tuple[Tensor, Tensor]:
    """(lower, upper) quantiles over the first dim of (draws, ...) values, NaN left out."""
    tail = (1 - level) / 2
    return torch.nanquantile(values, tail, dim=0), torch.nanquantile(values, 1 - tail, dim=0)


def bootstrap_win_matrix(
    per_prompt: Tensor, draws: int = DRAWS, seed: int = 0, level: float = LEVEL
) -> tuple[Tensor, Tensor]:
    """Interval of each W[a, b] = nanmean over prompts of per_prompt[p, a, b].

    Args:
        per_prompt: (P, M, M) per-prompt win rates (NaN: no verdict on that prompt).
    Returns:
        (lower, upper), each (M, M); the diagonal is exactly 1/2; NaN where fewer than
        `MIN_INTERVAL_PROMPTS` prompts have a verdict.
    """
    idx = prompt_resamples(per_prompt.shape[0], draws, seed)  # (draws, P)
    means = torch.nanmean(per_prompt.double()[idx], dim=1)  # (draws, M, M)
    lo, hi = percentile_interval(means, level)
    few = (~per_prompt.isnan()).sum(dim=0) < MIN_INTERVAL_PROMPTS  # (M, M)
    lo[few], hi[few] = float("nan"), float("nan")
    lo.fill_diagonal_(0.5)
    hi.fill_diagonal_(0.5)
    return lo, hi


def bootstrap_lc(
    pref: Tensor, len_diff: Tensor, draws: int = LC_DRAWS, seed: int = 0, level: float = LEVEL
) -> tuple[float | None, float | None]:
    """Interval of the length-controlled win rate (`fit_length_logistic`), refit on each
    resample of the prompts. pref, len_diff: (P, K), K comparisons per prompt. (None, None)
    from fewer than `MIN_INTERVAL_PROMPTS` prompts with a verdict."""
    if verdict_prompts(pref) < MIN_INTERVAL_PROMPTS:
        return None, None
    idx = prompt_resamples(pref.shape[0], draws, seed).numpy()
    y, d = pref.double().numpy(), len_diff.double().numpy()  # numpy: little overhead per refit
    fits = [fit_length_logistic(y[row], d[row])["lc"] for row in idx]
    values = torch.tensor([float("nan") if x is None else x for x in fits], dtype=torch.float64)
    if torch.isnan(values).all():
        return None, None
    lo, hi = percentile_interval(values, level)
    return float(lo), float(hi)


def verdict_prompts(pref: Tensor) -> int:
    """The prompts of (P, K) preferences with at least one verdict (not NaN)."""
    return int((~pref.isnan()).any(dim=1).sum())


def versus(
    pref: Tensor, tokens: Tensor, win_matrix: Tensor, ci: tuple[Tensor, Tensor], a: int, b: int, seed: int
) -> dict:
    """Model a against model b: raw and length-controlled win rates with intervals (None from
    too few prompts), and the prompts they read."""
    y, d = pair_observations(pref, tokens, a, b)
    fit = fit_length_logistic(y, d)
    lo, hi = bootstrap_lc(y, d, seed=seed)
    return {
        "raw": _finite(win_matrix[a, b]),  # None: no verdict on the pair
        "raw_ci95": [_finite(ci[0][a, b]), _finite(ci[1][a, b])],
        "lc": fit["lc"],
        "lc_ci95": [lo, hi],
        "length_slope": fit["b"],
        "comparisons": fit["n"],
        "prompts": verdict_prompts(y),
    }


def compare_iterates(pref: Tensor, tokens: Tensor, seed: int = 0) -> dict:
    """eval.json's comparisons.

    Args:
        pref: (P, M*S, M*S) response preferences, responses model-major.
        tokens: (P, M, S) response lengths in tokens.
        seed: the bootstrap's seed (the evaluation's `pofe.eval.seed`).
    """
    P, M, S = tokens.shape
    w = block_win_matrix(pref, M, S)  # eval.json's win_matrix
    ci = bootstrap_win_matrix(per_prompt_win_matrix(pref, M, S), seed=seed)
    vs_pi_0 = [None] + [versus(pref, tokens, w, ci, m, 0, seed) for m in range(1, M)]
    # pi_1's previous iterate is pi_0: the same comparison
    vs_prev = [None] + [vs_pi_0[1] if m == 1 else versus(pref, tokens, w, ci, m, m - 1, seed) for m in range(1, M)]
    per_model = [tokens[:, m].reshape(-1).tolist() for m in range(M)]
    return {
        "win_matrix_ci95": [[[_finite(x) for x in pair] for pair in row] for row in torch.stack(ci, dim=-1)],
        "vs_pi_0": vs_pi_0,
        "vs_previous": vs_prev,
        "response_tokens": {
            "mean": [sum(x) / len(x) for x in per_model],
            "median": [float(statistics.median(x)) if x else None for x in per_model],
        },
    }


def reward_comparisons(
    rewards: Tensor, draws: int = DRAWS, seed: int = 0, level: float = LEVEL, min_prompts: int = MIN_INTERVAL_PROMPTS
) -> dict:
    """eval.json's reward comparisons (a scalar judge's): per model its mean reward's interval, and
    its mean reward minus pi_0's and minus the previous model's, each with a paired interval.

    Args:
        rewards: (P, M, S) reward of model m's sample s on prompt p (NaN = abstained).
    Returns:
        {"reward_ci95": [M][lower, upper], "reward_prompts": [M] prompts with a reward,
        "reward_vs_pi_0": [None, {"diff", "diff_ci95", "prompts"}, ...], "reward_vs_previous": the
        same against model m - 1}. A mean is over every (prompt, sample) with a reward, as
        eval.json's `mean_reward`; an interval resamples the prompts (their samples together)
        and, for a difference, the same prompts for both models (`prompts`: those where both
        have a reward). Intervals from fewer than `min_prompts` prompts are [None, None].
    """
    P, M, _ = rewards.shape
    r = rewards.double()
    sums = torch.nansum(r, dim=2)  # (P, M)
    counts = (~r.isnan()).sum(dim=2).double()  # (P, M)
    idx = prompt_resamples(P, draws, seed)  # (draws, P)
    means = sums.sum(0) / counts.sum(0)  # (M,)
    drawn = sums[idx].sum(1) / counts[idx].sum(1)  # (draws, M)
    lo, hi = percentile_interval(drawn, level)
    rated = counts > 0  # (P, M): the prompts where a model has a reward
    prompts = rated.sum(0).tolist()  # (M,)

    def interval(lower: Tensor, upper: Tensor, n: int) -> list[float | None]:
        return [_finite(lower), _finite(upper)] if n >= min_prompts else [None, None]

    def versus(a: int, b: int) -> dict:
        d_lo, d_hi = percentile_interval(drawn[:, a] - drawn[:, b], level)
        n = int((rated[:, a] & rated[:, b]).sum())
        return {"diff": _finite(means[a] - means[b]), "diff_ci95": interval(d_lo, d_hi, n), "prompts": n}

    return {
        "reward_ci95": [interval(lo[m], hi[m], prompts[m]) for m in range(M)],
        "reward_prompts": prompts,
        "reward_vs_pi_0": [None] + [versus(m, 0) for m in range(1, M)],
        "reward_vs_previous": [None] + [versus(m, m - 1) for m in range(1, M)],
    }


def _finite(x: Tensor) -> float | None:
    """A 0-dim tensor as a float, None when NaN (a model with no reward at all)."""
    value = float(x)
    return None if np.isnan(value) else value
