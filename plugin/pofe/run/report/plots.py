"""report-*.png: rewards per round, loss curves, win rates against pi_0 and lengths, the
win-rate matrix, drift per iterate, an online training's refreshes.

Each plot function returns its matplotlib figure, or None when the collected numbers
(`collect.collect`) hold none of its data; a panel without data says why. Readable whatever
the run's size: markers on series of few points, each series of a panel its own marker and line
style (overlapping lines stay visible), legends below the axes, not over the data. No scale
zooms into noise: lengths, KL and perplexity axes include 0 (a 0.1-token change stays small),
and the win-rate colours span 0..1 (a 0.499 is a pale tie, not dark red). A value that is
missing or not finite (a model the judge abstained on throughout: NaN in an eval.json) is left
out of its series, never drawn: matplotlib refuses NaN axis limits.
"""

from __future__ import annotations

import math
from pathlib import Path

from pofe.methods import method_spec
from pofe.run.report.cells import CLUSTERED

# (marker, line style) of the series of one panel, in order
SERIES_STYLES = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")]
# a series of at most this many points gets markers
FEW_POINTS = 30
HELD_OUT = "pi_t on the held-out prompts (95 % CI)"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def save(fig, out: Path) -> None:
    """The figure as a PNG, legends outside the axes included ("tight"), then freed."""
    fig.tight_layout()
    fig.savefig(out, dpi=100, bbox_inches="tight")
    _pyplot().close(fig)


def _number(y) -> bool:
    """Whether `y` is a value to draw: neither missing nor NaN / inf."""
    return y is not None and math.isfinite(y)


def _line(ax, xs: list, ys: list, label: str, i: int, **kwargs) -> None:
    """Series i of a panel: its own marker and line style, and hollow markers shrinking with i,
    so series that overlap stay distinguishable (nested shapes); markers only on a series of
    few points (a single point is invisible as a line)."""
    marker, style = SERIES_STYLES[i % len(SERIES_STYLES)]
    ax.plot(
        xs,
        ys,
        marker=marker if len(xs) <= FEW_POINTS else None,
        markersize=max(11 - 1.5 * i, 4),
        markerfacecolor="none",  # hollow: a marker drawn over another leaves it visible
        markeredgewidth=1.5,
        linestyle=style,
        alpha=0.85,
        label=label,
        **kwargs,
    )


def _style(ax, xlabel: str) -> None:
    """Integer steps or rounds on x, the legend below the axes (never over the data, and the
    axes keep the figure's width), a light grid."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _widen(ax)
    ax.set_xlabel(xlabel)
    labels = ax.get_legend_handles_labels()[1]
    if labels:
        columns = 2 if max(map(len, labels)) > 20 else min(len(labels), 4)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=columns, frameon=False)
    ax.grid(alpha=0.3)


def split_average(values: list, ev: dict) -> tuple[list, object]:
    """Per-model `values` of eval.json as (pi_0..pi_T's, pi_avg's or None): pi_avg is drawn as
    a point of its own, not as one more iterate on the rounds' axis."""
    index = (ev.get("average") or {}).get("index")
    if index is None:
        return list(values), None
    return list(values[:index]), values[index]


def _average_mark(ax, y, label: str = "pi_avg") -> None:
    """pi_avg's value as a dashed line across the iterates (none without a finite value)."""
    if _number(y):
        ax.axhline(y, color="purple", lw=1.0, ls=":", label=label)


def _widen(ax) -> None:
    """An x range under one step (one point, or one model's two dodged points) widened by half
    a step each side, so the ticks are the data's integers, not fractions of one step."""
    lo, hi = ax.dataLim.intervalx
    if hi - lo < 1:
        ax.set_xlim(lo - 0.5, hi + 0.5)


def _empty(ax, why: str) -> None:
    """A panel without data says why instead of staying blank."""
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="gray", fontsize=9, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def rewards_plot(rep: dict):
    """Candidate, policy-sample, trained-model and held-out rewards against the round."""
    rounds, ev = rep["rounds"], rep["eval"]
    series = {
        "candidates: mean": [(r["round"], (r["candidates"] or {}).get("mean_reward")) for r in rounds],
        "candidates: best-of-k": [(r["round"], (r["candidates"] or {}).get("best_of_k_reward")) for r in rounds],
        "policy samples": [(r["round"], (r["candidates"] or {}).get("policy_sample_mean_reward")) for r in rounds],
        "pi_t on its own round's prompts (trained on)": [
            (r["round"], (r["trained_on_train_prompts"] or {}).get("model_mean_reward")) for r in rounds
        ],
    }
    average = None
    if ev and ev.get("mean_reward"):
        held_out, average = split_average(ev["mean_reward"], ev)
        series[HELD_OUT] = list(enumerate(held_out))
    if ev and ev.get("best_of_k"):
        series["held-out: best-of-k of round t's candidates"] = [
            (b["round"], b["best_of_k_reward"]) for b in ev["best_of_k"]
        ]
    series = {k: [(x, y) for x, y in v if _number(y)] for k, v in series.items()}
    if not any(series.values()):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, points) in enumerate(series.items()):
        if points:
            _line(ax, [x for x, _ in points], [y for _, y in points], name, i)
    _average_mark(ax, average, "pi_avg on the held-out prompts")
    _held_out_intervals(ax, ev)
    # candidates of round t come from pi_{t-1}; the trained model of round t is pi_t
    _style(ax, "round t (models: pi_t, 0 = base)")
    ax.set_ylabel("mean reward")
    ax.set_title("Rewards per round")
    return fig


def _held_out_intervals(ax, ev: dict | None) -> None:
    """The held-out mean rewards' 95 % intervals (`reward_ci95`, what the choice of a model reads
    with a scalar judge) as error bars on their line."""
    if not ev or not ev.get("reward_ci95") or not ev.get("mean_reward"):
        return
    line = next((ln for ln in ax.lines if ln.get_label() == HELD_OUT), None)
    means, _ = split_average(ev["mean_reward"], ev)
    cis, _ = split_average(ev["reward_ci95"], ev)
    points = [(m, y, ci) for m, (y, ci) in enumerate(zip(means, cis)) if _number(y) and ci and all(map(_number, ci))]
    if line is None or not points:
        return
    ax.errorbar(
        [m for m, _, _ in points],
        [y for _, y, _ in points],
        yerr=[[y - ci[0] for _, y, ci in points], [ci[1] - y for _, y, ci in points]],
        fmt="none",
        ecolor=line.get_color(),
        capsize=3,
    )


def loss_plot(rep: dict):
    """The loss and the method's diagnostic, rounds concatenated along the steps (a dotted line
    where a round starts)."""
    curves = [(r["round"], r["train"]) for r in rep["rounds"] if r["train"]]
    if not curves:
        return None
    diagnostic = curves[0][1]["diagnostic"]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    offset = 0
    for i, (t, train) in enumerate(curves):
        for ax, key in zip(axes, ("loss", diagnostic)):
            points = train["curves"].get(key, [])
            if points:
                _line(ax, [offset + s for s, _ in points], [v for _, v in points], f"round {t}", i, color=f"C{i}")
            if offset:
                ax.axvline(offset + 0.5, color="gray", lw=0.6, ls=":")
        offset += train["steps"]
    axes[0].set_title("training loss")
    axes[1].set_title(f"{method_spec(rep['method']).diagnostic_label} ({diagnostic})")
    for ax, key in zip(axes, ("loss", diagnostic)):
        if any(train["curves"].get(key) for _, train in curves):
            _style(ax, "step (rounds concatenated)")
            # a loss and a diagnostic (a rate, a spread) are drawn from 0: a win-rate spread of
            # 0.5140 then 0.5125 is a flat line, not a drop
            _from_zero(ax, [v for _, train in curves for _, v in train["curves"].get(key, [])])
        elif any(train["curves"] for _, train in curves):
            _empty(ax, f"no {key} in the trainer's logs")
        else:  # nothing logged at all: every round shorter than logging_steps
            every = {train["logging_steps"] for _, train in curves}
            ran = ", ".join(f"round {t}: {train['steps']}" for t, train in curves)
            _empty(ax, f"nothing logged: logging_steps {', '.join(map(str, sorted(every)))},\nsteps run ({ran})")
    return fig


def winrate_plot(ev: dict):
    """The (M, M) win-rate matrix as a heat map, each cell labelled (3 decimals when the rates
    cluster at 1/2). The colours span the whole 0..1, always: rates that cluster at 1/2 are ties
    and stay pale, as they are; a scale zoomed to their spread painted 0.499 dark red."""
    names = [m["name"] for m in ev["models"]]
    w = ev["win_matrix"]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2, 1.1 * len(names) + 1.5))
    image = ax.imshow(w, vmin=0.0, vmax=1.0, cmap="RdBu")
    ax.set_xticks(range(len(names)), names)
    ax.set_yticks(range(len(names)), names)
    digits = 3 if ev["win_matrix_spread"] < CLUSTERED else 2
    for i in range(len(names)):
        for j in range(len(names)):
            known = _number(w[i][j])  # else no verdict on the pair: "-"
            dark = known and abs(w[i][j] - 0.5) > 0.3  # the colour map's dark ends: white text
            label = f"{w[i][j]:.{digits}f}" if known else "-"
            ax.text(j, i, label, ha="center", va="center", fontsize=9, color="w" if dark else "k")
    how = "Bradley-Terry on the rewards" if ev.get("win_matrix_method") == "bradley_terry" else "the pairwise judge"
    ax.set_title(f"P(row beats column)\n{how}")
    ticks = [0.0, 0.25, 0.5, 0.75, 1.0]
    fig.colorbar(image, ax=ax, ticks=ticks, format=f"%.{distinct_digits(ticks)}f")
    return fig


def distinct_digits(values: list[float]) -> int:
    """The fewest decimals (2 to 4) at which `values` print distinct."""
    return next((d for d in (2, 3) if len({f"{v:.{d}f}" for v in values}) == len(values)), 4)


def _from_zero(ax, values: list) -> None:
    """A y axis that includes 0 (and the data): a magnitude drawn from 0, so a small change looks small."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return
    lo, hi = min(0.0, *finite), max(0.0, *finite)
    pad = 0.08 * (hi - lo) or 1.0
    ax.set_ylim(lo - (pad if lo < 0 else 0), hi + pad)


def drift_plot(ev: dict):
    """Response length, KL to pi_0 and (with references) perplexity per iterate."""
    names, _ = split_average([m["name"] for m in ev["models"]], ev)
    panels = [("mean response tokens", ev["mean_response_tokens"]), ("KL to pi_0", ev["kl_to_pi_0"])]
    if ev.get("perplexity"):
        panels.append(("reference perplexity", ev["perplexity"]))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5))
    for ax, (title, values) in zip(axes, panels):
        ys, average = split_average(values, ev)
        _line(ax, list(range(len(ys))), ys, title, 0)
        _average_mark(ax, average)
        _from_zero(ax, [*ys, average])
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if average is not None:
            ax.legend(fontsize=8)
    return fig


def lengths_plot(rep: dict):
    """Each iterate's held-out win rate against pi_0, raw and length-controlled, with their
    intervals; and mean tokens per round: candidates, best and worst, held-out answers."""
    ev = rep["eval"] or {}
    versus_pi_0, average = split_average(ev.get("vs_pi_0") or [], ev)
    wins = [(m, v) for m, v in enumerate(versus_pi_0) if v and (_number(v["raw"]) or _number(v["lc"]))]
    per_round = [(r["round"], r["lengths"]) for r in rep["rounds"] if r.get("lengths")]
    if not wins and not per_round:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (key, ci_key, label, dx) in enumerate(
        (("raw", "raw_ci95", "raw", -0.05), ("lc", "lc_ci95", "length-controlled", 0.05))
    ):
        points = [(m + dx, v[key], v[ci_key]) for m, v in wins if _number(v[key])]
        if points:
            lows = [y - (ci[0] if _number(ci[0]) else y) for _, y, ci in points]
            highs = [(ci[1] if _number(ci[1]) else y) - y for _, y, ci in points]
            marker, style = SERIES_STYLES[i]
            axes[0].errorbar(
                [x for x, _, _ in points],
                [y for _, y, _ in points],
                yerr=[lows, highs],
                marker=marker,
                linestyle=style,
                capsize=3,
                label=label,
            )
    _average_mark(axes[0], (average or {}).get("lc"), "pi_avg, length-controlled")
    bt = ev.get("win_matrix_method") == "bradley_terry"  # a scalar judge's: the choice reads its rewards
    axes[0].set_title(
        "held-out win rate of pi_t against pi_0 (95 % CI)" + ("\nBradley-Terry on the rewards" if bt else "")
    )
    if wins:
        axes[0].axhline(0.5, color="gray", lw=0.8, ls="--")
        axes[0].set_ylim(0, 1)
        _style(axes[0], "model pi_t")
        axes[0].set_xticks([m for m, _ in wins], [f"pi_{m}" for m, _ in wins])
    else:
        _empty(axes[0], "no held-out win rate (pofe.eval.held_out), or no verdict of the judge on them")
    i = 0
    for key, label in (("candidates", "candidates"), ("best", "best (chosen)"), ("worst", "worst (rejected)")):
        points = [(t, lengths[key]["mean"]) for t, lengths in per_round if lengths[key]["mean"] is not None]
        if points:
            _line(axes[1], [x for x, _ in points], [y for _, y in points], f"round t {label}", i)
            i += 1
    if ev.get("response_tokens"):
        tokens, average_tokens = split_average(ev["response_tokens"]["mean"], ev)
        _line(axes[1], list(range(len(tokens))), tokens, "held-out answers of pi_t", i)
        _average_mark(axes[1], average_tokens, "held-out answers of pi_avg")
    _from_zero(axes[1], [y for line in axes[1].lines for y in line.get_ydata()])
    axes[1].set_title("mean tokens")
    _style(axes[1], "round t / model pi_t (0 = base)")
    return fig


def online_plot(rep: dict):
    """An online training's refreshes against the step they were sampled at: the candidate
    reward of the policy's own samples (mean, best-of-k), and the KL to pi_0."""
    refreshes = (rep.get("online") or {}).get("refreshes")
    if not refreshes:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = (
        (axes[0], (("candidate_reward_mean", "policy samples: mean"), ("candidate_reward_best", "best-of-k"))),
        (axes[1], (("kl_to_pi_0", "log pi - log pi_0 of the candidates trained on"),)),
    )
    for ax, series in panels:
        for i, (key, label) in enumerate(series):
            points = [(r["step"], r[key]) for r in refreshes if r.get(key) is not None]
            if points:
                _line(ax, [x for x, _ in points], [y for _, y in points], label, i)
    axes[0].set_title("candidate reward per refresh")
    axes[0].set_ylabel("mean reward")
    axes[1].set_title("KL to pi_0 per refresh")
    axes[1].set_ylabel("mean log-ratio (nats)")
    for ax in axes:
        if ax.lines:
            _style(ax, "step the refresh was sampled at")
        else:
            _empty(ax, "not measured (pofe.online.kl_coef 0)" if ax is axes[1] else "no scalar reward")
    return fig


def make_plots(rep: dict, out_dir: Path) -> dict[str, str]:
    """PNG plots beside the report; returns {name: file name} for those with data."""
    figures = {
        "rewards": rewards_plot(rep),
        "loss": loss_plot(rep),
        "lengths": lengths_plot(rep),
        "online": online_plot(rep),
    }
    if rep["eval"]:
        figures |= {"winrate": winrate_plot(rep["eval"]), "drift": drift_plot(rep["eval"])}
    plots = {}
    for name, fig in figures.items():
        if fig is not None:
            plots[name] = f"report-{name}.png"
            save(fig, out_dir / plots[name])
    return plots
