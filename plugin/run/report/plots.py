"""report-*.png: rewards per round, loss curves, win rates against pi_0 and lengths, the
win-rate matrix, drift per iterate.

Each plot is drawn only when the collected numbers (`collect.collect`) hold its data.
"""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, out: Path) -> None:
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _style(ax, xlabel: str) -> None:
    """Integer steps or rounds on x, a small legend, a light grid."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def split_average(values: list, ev: dict) -> tuple[list, object]:
    """Per-model `values` of eval.json as (pi_0..pi_T's, pi_avg's or None): pi_avg is drawn as
    a point of its own, not as one more iterate on the rounds' axis."""
    index = (ev.get("average") or {}).get("index")
    if index is None:
        return list(values), None
    return list(values[:index]), values[index]


def _average_mark(ax, y, label: str = "pi_avg") -> None:
    """pi_avg's value as a dashed line across the iterates."""
    if y is not None:
        ax.axhline(y, color="purple", lw=1.0, ls=":", label=label)


def rewards_plot(rep: dict, out: Path) -> bool:
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
        series["pi_t on the held-out prompts"] = list(enumerate(held_out))
    if ev and ev.get("best_of_k"):
        series["held-out: best-of-k of round t's candidates"] = [
            (b["round"], b["best_of_k_reward"]) for b in ev["best_of_k"]
        ]
    series = {k: [(x, y) for x, y in v if y is not None] for k, v in series.items()}
    if not any(series.values()):
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in series.items():
        if points:
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
    _average_mark(ax, average, "pi_avg on the held-out prompts")
    # candidates of round t come from pi_{t-1}; the trained model of round t is pi_t
    _style(ax, "round t (models: pi_t, 0 = base)")
    ax.set_ylabel("mean reward")
    ax.set_title("Rewards per round")
    _save(plt, fig, out)
    return True


def loss_plot(rep: dict, out: Path) -> bool:
    """The loss and the method's diagnostic, rounds concatenated along the steps."""
    curves = [(r["round"], r["train"]) for r in rep["rounds"] if r["train"]]
    if not curves:
        return False
    diagnostic = curves[0][1]["diagnostic"]
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    offset = 0
    for t, train in curves:
        points = train["curves"]["loss"]
        axes[0].plot([offset + s for s, _ in points], [v for _, v in points], label=f"round {t}")
        points = train["curves"].get(diagnostic, [])
        axes[1].plot([offset + s for s, _ in points], [v for _, v in points], label=f"round {t}")
        offset += train["steps"]
    axes[0].set_title("training loss")
    axes[1].set_title(diagnostic)
    for ax in axes:
        _style(ax, "step (rounds concatenated)")
    _save(plt, fig, out)
    return True


def winrate_plot(ev: dict, out: Path) -> None:
    """The (M, M) win-rate matrix as a heat map, each cell labelled."""
    names = [m["name"] for m in ev["models"]]
    w = ev["win_matrix"]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2, 1.1 * len(names) + 1.5))
    image = ax.imshow(w, vmin=0, vmax=1, cmap="RdBu")
    ax.set_xticks(range(len(names)), names)
    ax.set_yticks(range(len(names)), names)
    for i in range(len(names)):
        for j in range(len(names)):
            ax.text(j, i, f"{w[i][j]:.2f}", ha="center", va="center", fontsize=9)
    ax.set_title("P(row beats column)")
    fig.colorbar(image, ax=ax)
    _save(plt, fig, out)


def drift_plot(ev: dict, out: Path) -> None:
    """Response length, KL to pi_0 and (with references) perplexity per iterate."""
    names, _ = split_average([m["name"] for m in ev["models"]], ev)
    panels = [("mean response tokens", ev["mean_response_tokens"]), ("KL to pi_0", ev["kl_to_base"])]
    if ev.get("perplexity"):
        panels.append(("reference perplexity", ev["perplexity"]))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5))
    for ax, (title, values) in zip(axes, panels):
        ys, average = split_average(values, ev)
        ax.plot(range(len(ys)), ys, marker="o")
        _average_mark(ax, average)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if average is not None:
            ax.legend(fontsize=8)
    _save(plt, fig, out)


def lengths_plot(rep: dict, out: Path) -> bool:
    """Each iterate's held-out win rate against pi_0, raw and length-controlled, with their
    intervals; and mean tokens per round: candidates, best and worst, held-out answers."""
    ev = rep["eval"] or {}
    versus_pi_0, average = split_average(ev.get("vs_pi_0") or [], ev)
    wins = [(m, v) for m, v in enumerate(versus_pi_0) if v]
    per_round = [(r["round"], r["lengths"]) for r in rep["rounds"] if r.get("lengths")]
    if not wins and not per_round:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key, ci_key, label, dx in (("raw", "raw_ci95", "raw", -0.05), ("lc", "lc_ci95", "length-controlled", 0.05)):
        points = [(m + dx, v[key], v[ci_key]) for m, v in wins if v[key] is not None]
        if points:
            lows = [y - (ci[0] if ci[0] is not None else y) for _, y, ci in points]
            highs = [(ci[1] if ci[1] is not None else y) - y for _, y, ci in points]
            axes[0].errorbar(
                [x for x, _, _ in points],
                [y for _, y, _ in points],
                yerr=[lows, highs],
                marker="o",
                capsize=3,
                label=label,
            )
    _average_mark(axes[0], (average or {}).get("lc"), "pi_avg, length-controlled")
    axes[0].axhline(0.5, color="gray", lw=0.8, ls="--")
    axes[0].set_ylim(0, 1)
    axes[0].set_title("held-out win rate of pi_t against pi_0 (95 % CI)")
    _style(axes[0], "model pi_t")
    for key, label in (("candidates", "candidates"), ("best", "best (chosen)"), ("worst", "worst (rejected)")):
        points = [(t, lengths[key]["mean"]) for t, lengths in per_round if lengths[key]["mean"] is not None]
        if points:
            axes[1].plot([x for x, _ in points], [y for _, y in points], marker="o", label=f"round t {label}")
    if ev.get("response_tokens"):
        tokens, average_tokens = split_average(ev["response_tokens"]["mean"], ev)
        axes[1].plot(range(len(tokens)), tokens, marker="s", label="held-out answers of pi_t")
        _average_mark(axes[1], average_tokens, "held-out answers of pi_avg")
    axes[1].set_title("mean tokens")
    _style(axes[1], "round t / model pi_t (0 = base)")
    _save(plt, fig, out)
    return True


def make_plots(rep: dict, out_dir: Path) -> dict[str, str]:
    """PNG plots beside the report; returns {name: file name} for those with data."""
    plots: dict[str, str] = {}
    if rewards_plot(rep, out_dir / "report-rewards.png"):
        plots["rewards"] = "report-rewards.png"
    if loss_plot(rep, out_dir / "report-loss.png"):
        plots["loss"] = "report-loss.png"
    if lengths_plot(rep, out_dir / "report-lengths.png"):
        plots["lengths"] = "report-lengths.png"
    if rep["eval"]:
        winrate_plot(rep["eval"], out_dir / "report-winrate.png")
        plots["winrate"] = "report-winrate.png"
        drift_plot(rep["eval"], out_dir / "report-drift.png")
        plots["drift"] = "report-drift.png"
    return plots
