"""The run report: report.md + report-*.png + report.json in the run's output_dir.

Every number comes from the run's own files: the state file (stages, policies), each
round's candidates/summary.json and judge shards, each round's trainer_state.json (loss
curves), and eval/eval.json (`axolotl pofe eval`). A section without data says so.

    axolotl pofe report recipe.yml      # (re)write the report of a run

Cycles: W[a, b] = P(a's response beats b's). "a beats b" means W[a, b] > threshold
(0.5 by default; `pofe.eval.cycle_threshold` raises it to ignore noise). `find_cycles`
lists every 3-cycle a > b > c > a. A tournament (every pair decided) is intransitive iff
it holds a 3-cycle, so 3-cycles are enough to flag any cycle there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .rounds import RunLayout, read_jsonl, write_atomic

REPORT_MD = "report.md"
REPORT_JSON = "report.json"


# ---- pure functions ------------------------------------------------------------------------------


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


def _mean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else None


# ---- collecting the run's numbers ----------------------------------------------------------------


def _shards(folder: Path) -> list[dict]:
    return [r for p in sorted(folder.glob("shard-*.jsonl")) for r in read_jsonl(p)]


def candidate_stats(cand_dir: Path, first_n: int | None = None) -> dict | None:
    """From the pipeline's shards: mean / best-of-k reward of all candidates and the mean
    reward of the policy's own samples (optionally over the first `first_n` prompts)."""
    judged = _shards(cand_dir / "judge")
    if not judged:
        return None
    generated = {g["index"]: g for g in _shards(cand_dir / "generate")}
    all_r, best, policy_r = [], [], []
    for r in judged:
        if first_n is not None and r["index"] >= first_n:
            continue
        rewards = r.get("rewards")
        if not rewards:
            continue
        all_r += rewards
        best.append(max(rewards))
        g = generated.get(r["index"], {})
        source = dict(zip(g.get("candidates", []), g.get("sources", [])))
        policy_r += [x for resp, x in zip(r["responses"], rewards) if source.get(resp) == "policy"]
    return {
        "prompts": len(best),
        "mean_reward": _mean(all_r),
        "best_of_k_reward": _mean(best),
        "policy_sample_mean_reward": _mean(policy_r),
    }


def training_stats(trainer_state: Path, method: str) -> dict | None:
    if not trainer_state.exists():
        return None
    history = json.loads(trainer_state.read_text())["log_history"]
    steps = [h for h in history if "loss" in h and "step" in h]
    if not steps:
        return None
    key = "rrhf/rank_accuracy" if method == "rrhf" else "sppo/win_rate_spread"
    curves: dict[str, list] = {}
    for name in ("loss", key, "rrhf/rank", "rrhf/ft", "sppo/logratio", "sppo/target"):
        pts = [[h["step"], h[name]] for h in steps if name in h]
        if pts:
            curves[name] = pts
    spread = curves.get(key, [])
    return {
        "steps": steps[-1]["step"],
        "first_loss": steps[0]["loss"],
        "last_loss": steps[-1]["loss"],
        "diagnostic": key,
        "diagnostic_first": spread[0][1] if spread else None,
        "diagnostic_last": spread[-1][1] if spread else None,
        "curves": curves,
    }


def collect(layout: RunLayout) -> dict:
    """Everything the report shows, as one JSON-able dict."""
    state = json.loads(layout.state.read_text()) if layout.state.exists() else None
    if state is None:
        raise ValueError(f"no run state at {layout.state}: nothing to report")
    method = state["method"]
    eval_path = layout.eval_dir / "eval.json"
    ev = json.loads(eval_path.read_text()) if eval_path.exists() else None
    rounds = []
    for key in sorted(state["rounds"], key=int):
        t = int(key)
        info = state["rounds"][key]
        summary_path = layout.candidates(t) / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        prompts = layout.round_prompts(t)
        rec: dict[str, Any] = {
            "round": t,
            "policy_in": info.get("policy_in"),
            "policy_out": info.get("policy_out"),
            "generate_seed": info.get("generate_seed"),
            "prompts": len(read_jsonl(prompts)) if prompts.exists() else None,
            "stage_seconds": {
                s.split("/")[1]: v.get("seconds")
                for s, v in state["stages"].items() if s.startswith(f"round-{t}/") and v.get("status") == "done"
            },
            "candidates": None,
            "train": training_stats(layout.trainer_state(t), method),
            "trained_on_train_prompts": None,
        }
        if summary is not None:
            stats = candidate_stats(layout.candidates(t)) or {}
            rec["candidates"] = {
                "rows": summary["rows"],
                "per_prompt": summary["candidates_per_prompt"]["mean"],
                "mean_reward": summary["mean_candidate_reward"],
                "best_of_k_reward": summary["mean_best_of_k_reward"],
                "policy_sample_mean_reward": stats.get("policy_sample_mean_reward"),
                "mean_tokens": summary["mean_candidate_tokens"],
                "mean_best_win_rate": summary.get("mean_best_win_rate"),
                "judge_abstentions": summary["judge_abstentions"],
            }
        tp = (ev or {}).get("train_prompts", {}).get(str(t))
        if tp:
            same = candidate_stats(layout.candidates(t), first_n=tp["num_prompts"]) or {}
            rec["trained_on_train_prompts"] = {
                "num_prompts": tp["num_prompts"],
                "model_mean_reward": tp["mean_reward"],
                "candidates_mean_reward": same.get("mean_reward"),
                "candidates_best_of_k_reward": same.get("best_of_k_reward"),
            }
        rounds.append(rec)
    report: dict[str, Any] = {
        "output_dir": str(layout.root),
        "method": method,
        "rounds_planned": state.get("rounds_planned"),
        "rounds_finished": sum(1 for r in rounds if r["policy_out"]),
        "final_policy": state.get("final_policy"),
        "starts": len(state.get("starts", [])),
        "rounds": rounds,
        "eval": None,
    }
    if ev is not None:
        thr = ev.get("cycle_threshold", 0.5)
        ev = dict(ev)
        ev["cycles"] = find_cycles(ev["win_matrix"], thr)
        ev["cycles_judge2"] = find_cycles(ev["win_matrix_judge2"], thr) if ev.get("win_matrix_judge2") else None
        report["eval"] = ev
    return report


# ---- rendering ------------------------------------------------------------------------------------


def _f(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def render_markdown(rep: dict, plots: dict[str, str]) -> str:
    method = rep["method"]
    md = [f"# POFE run report: {method.upper()}, {rep['rounds_finished']} of {rep['rounds_planned']} rounds", ""]
    md.append(f"Output dir `{rep['output_dir']}`; final policy `{rep['final_policy'] or '(no round finished)'}`; "
              f"the run was started {rep['starts']} time(s).")
    md.append("")

    md += ["## Rounds", ""]
    if not rep["rounds"]:
        md += ["No round has started.", ""]
    else:
        diag = "rank accuracy" if method == "rrhf" else "win-rate spread"
        header = ["round", "prompts", "cands/prompt", "cand. mean reward", "policy samples' reward",
                  "best-of-k", "trained model reward (its prompts)", "steps", "loss first -> last",
                  f"{diag} first -> last"]
        rows = []
        for r in rep["rounds"]:
            c, tr, tp = r["candidates"] or {}, r["train"] or {}, r["trained_on_train_prompts"] or {}
            trained = (f"{_f(tp.get('model_mean_reward'))} (n={tp['num_prompts']}; cands there: mean "
                       f"{_f(tp.get('candidates_mean_reward'))}, best {_f(tp.get('candidates_best_of_k_reward'))})"
                       if tp else "-")
            rows.append([
                str(r["round"]), _f(r["prompts"]), _f(c.get("per_prompt"), 2), _f(c.get("mean_reward")),
                _f(c.get("policy_sample_mean_reward")), _f(c.get("best_of_k_reward")), trained,
                _f(tr.get("steps")),
                f"{_f(tr.get('first_loss'))} -> {_f(tr.get('last_loss'))}" if tr else "-",
                f"{_f(tr.get('diagnostic_first'))} -> {_f(tr.get('diagnostic_last'))}" if tr else "-",
            ])
        md += [_table(header, rows), ""]
        md.append("Candidate rewards come from each round's `candidates/summary.json` and judge shards "
                  "('policy samples' = the round's starting policy's own samples; the rest are dataset "
                  "responses). RRHF's trained model tends to the best-of-k reward of its candidates: "
                  "when it reaches it, better candidates help more than more epochs. `-`: no data "
                  "(a scalar judge and `pofe.eval.train_prompts` > 0 give the trained model's column).")
        if method == "sppo":
            md.append("SPPO's win-rate spread near 0 means the judge sees no difference between samples "
                      "(saturation: the gradient vanishes).")
        md.append("")
        if "rewards" in plots:
            md += [f"![rewards per round]({plots['rewards']})", ""]
        md += ["### Loss curves", ""]
        if "loss" in plots:
            md += [f"![loss curves]({plots['loss']})", ""]
        else:
            md += ["No loss curves: no round has a trainer_state.json.", ""]

    md += ["## Held-out evaluation", ""]
    ev = rep["eval"]
    if ev is None:
        md += ["No evaluation data: the recipe has no `pofe.eval` block, or `axolotl pofe eval` has not run.", ""]
        return "\n".join(md)
    names = [m["name"] for m in ev["models"]]
    d = ev["decoding"]
    md.append(f"{ev['num_prompts']} prompts from `{ev['prompts_source']}`, {d['num_samples']} sample(s) each at "
              f"temperature {d['temperature']}, top_p {d['top_p']}, seed {d['seed']}; judge `{ev['judge']['type']}`"
              + (f" ({ev['judge'].get('function') or ev['judge'].get('model')})" if ev['judge'] else "")
              + (f", second judge `{ev['judge2']['type']}`" if ev.get("judge2") else ", no second judge") + ".")
    md.append("")
    w = ev["win_matrix"]
    header = ["model", "mean reward", "2nd judge reward", "win vs pi_0", "win vs previous", "win vs 2 back",
              "mean tokens", "mean chars", "KL to pi_0", "ref. perplexity"]
    rows = []
    for i, n in enumerate(names):
        rows.append([
            n,
            _f((ev["mean_reward"] or [None] * len(names))[i]),
            _f((ev["mean_reward_judge2"] or [None] * len(names))[i]),
            _f(w[i][0]) if i >= 1 else "-",
            _f(w[i][i - 1]) if i >= 1 else "-",
            _f(w[i][i - 2]) if i >= 2 else "-",
            _f(ev["mean_response_tokens"][i], 2),
            _f(ev["mean_response_chars"][i], 2),
            _f(ev["kl_to_base"][i]),
            _f((ev["perplexity"] or [None] * len(names))[i]),
        ])
    md += [_table(header, rows), ""]
    if ev["mean_reward"] is None:
        md.append("Mean reward: none (the judge is pairwise and gives no scalar reward).")
    kl_note = ("an unbiased estimate of KL(pi_t || pi_0)" if ev.get("kl_is_unbiased")
               else "the mean log-ratio on the decoded samples (not an unbiased KL: temperature or top_p != 1)")
    md.append(f"KL to pi_0: mean over the model's own samples of log pi_t(y|x) - log pi_0(y|x), {kl_note}. "
              + ("Perplexity: of the held-out reference responses "
                 f"({ev['reference_count']} prompts have one)." if ev.get("perplexity")
                 else "Perplexity: no reference responses in the held-out prompts."))
    md.append("")

    for label, mat, cycles in (("", ev["win_matrix"], ev["cycles"]),
                               (" (second judge)", ev.get("win_matrix_judge2"), ev.get("cycles_judge2"))):
        if mat is None:
            if label:
                md += [f"### Win rates{label}", "", "No second judge (`pofe.eval.judge2`) was set.", ""]
            continue
        md += [f"### Win rates{label}", ""]
        how = ("Bradley-Terry on the scalar rewards, sigmoid(r_row - r_col)"
               if ev["win_matrix_method"] == "bradley_terry" or label else "the pairwise judge, both orders")
        md.append(f"Row beats column, averaged over prompts and sample pairs ({how}).")
        md += ["", _table(["", *names], [[n, *[_f(x) for x in row]] for n, row in zip(names, mat)]), ""]
        thr = ev.get("cycle_threshold", 0.5)
        if cycles:
            txt = "; ".join(f"{names[a]} > {names[b]} > {names[c]} > {names[a]}" for a, b, c in cycles)
            md += [f"**CYCLE**: {txt} (a beats b when W[a, b] > {thr}).", ""]
        else:
            md += [f"No cycle (3-cycles of 'W[a, b] > {thr}'); the iterates are ordered transitively.", ""]
    for key, alt in (("winrate", "win-rate matrix"), ("drift", "length, KL and perplexity per iterate")):
        if key in plots:
            md += [f"![{alt}]({plots[key]})", ""]
    return "\n".join(md)


def make_plots(rep: dict, out_dir: Path) -> dict[str, str]:
    """PNG plots beside the report; returns {name: file name} for those with data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    plots: dict[str, str] = {}
    rounds = rep["rounds"]
    ev = rep["eval"]

    series = {
        "candidates: mean": [(r["round"], (r["candidates"] or {}).get("mean_reward")) for r in rounds],
        "candidates: best-of-k": [(r["round"], (r["candidates"] or {}).get("best_of_k_reward")) for r in rounds],
        "policy samples": [(r["round"], (r["candidates"] or {}).get("policy_sample_mean_reward")) for r in rounds],
        "trained model, its prompts": [(r["round"], (r["trained_on_train_prompts"] or {}).get("model_mean_reward")) for r in rounds],
    }
    if ev and ev.get("mean_reward"):
        series["held-out reward (pi_t)"] = list(enumerate(ev["mean_reward"]))
    series = {k: [(x, y) for x, y in v if y is not None] for k, v in series.items()}
    if any(series.values()):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, pts in series.items():
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round t (held-out: model pi_t, 0 = base)")
        ax.set_ylabel("mean reward")
        ax.set_title("Rewards per round")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "report-rewards.png", dpi=100)
        plt.close(fig)
        plots["rewards"] = "report-rewards.png"

    curves = [(r["round"], r["train"]) for r in rounds if r["train"]]
    if curves:
        diag = curves[0][1]["diagnostic"]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        offset = 0
        for t, tr in curves:
            pts = tr["curves"]["loss"]
            axes[0].plot([offset + s for s, _ in pts], [v for _, v in pts], label=f"round {t}")
            dp = tr["curves"].get(diag, [])
            axes[1].plot([offset + s for s, _ in dp], [v for _, v in dp], label=f"round {t}")
            offset += tr["steps"]
        axes[0].set_title("training loss")
        axes[1].set_title(diag)
        for ax in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("step (rounds concatenated)")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "report-loss.png", dpi=100)
        plt.close(fig)
        plots["loss"] = "report-loss.png"

    if ev:
        names = [m["name"] for m in ev["models"]]
        w = ev["win_matrix"]
        fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2, 1.1 * len(names) + 1.5))
        im = ax.imshow(w, vmin=0, vmax=1, cmap="RdBu")
        ax.set_xticks(range(len(names)), names)
        ax.set_yticks(range(len(names)), names)
        for i in range(len(names)):
            for j in range(len(names)):
                ax.text(j, i, f"{w[i][j]:.2f}", ha="center", va="center", fontsize=9)
        ax.set_title("P(row beats column)")
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(out_dir / "report-winrate.png", dpi=100)
        plt.close(fig)
        plots["winrate"] = "report-winrate.png"

        panels = [("mean response tokens", ev["mean_response_tokens"]), ("KL to pi_0", ev["kl_to_base"])]
        if ev.get("perplexity"):
            panels.append(("reference perplexity", ev["perplexity"]))
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.5))
        for ax, (title, ys) in zip(axes, panels):
            ax.plot(range(len(ys)), ys, marker="o")
            ax.set_xticks(range(len(names)), names)
            ax.set_title(title)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "report-drift.png", dpi=100)
        plt.close(fig)
        plots["drift"] = "report-drift.png"
    return plots


@dataclass
class Report:
    data: dict
    markdown_path: Path
    json_path: Path
    plots: dict[str, str] = field(default_factory=dict)

    def terminal_summary(self) -> str:
        rep = self.data
        lines = [f"POFE {rep['method'].upper()}: {rep['rounds_finished']} of {rep['rounds_planned']} rounds -> "
                 f"{rep['final_policy']}"]
        for r in rep["rounds"]:
            c, tr = r["candidates"] or {}, r["train"] or {}
            lines.append(
                f"  round {r['round']}: candidates mean {_f(c.get('mean_reward'))}, best-of-k "
                f"{_f(c.get('best_of_k_reward'))}, policy samples {_f(c.get('policy_sample_mean_reward'))}; "
                f"loss {_f(tr.get('first_loss'))} -> {_f(tr.get('last_loss'))}"
            )
        ev = rep["eval"]
        if ev:
            names = [m["name"] for m in ev["models"]]
            rewards = ev["mean_reward"] or [None] * len(names)
            lines.append("  held-out: " + ", ".join(
                f"{n} reward {_f(r)} KL {_f(k)}" for n, r, k in zip(names, rewards, ev["kl_to_base"])))
            if ev["cycles"]:
                lines.append(f"  CYCLE in the win-rate matrix: {ev['cycles']}")
        else:
            lines.append("  no held-out evaluation")
        lines.append(f"  report: {self.markdown_path}")
        return "\n".join(lines)


def write_report(layout: RunLayout, cfg=None) -> Report:
    """Collect, plot and write report.md / report.json / report-*.png in layout.root."""
    rep = collect(layout)
    for stale in layout.root.glob("report-*.png"):
        stale.unlink()
    plots = make_plots(rep, layout.root)
    md_path, json_path = layout.root / REPORT_MD, layout.root / REPORT_JSON
    write_atomic(json_path, json.dumps(rep, indent=2) + "\n")
    write_atomic(md_path, render_markdown(rep, plots) + "\n")
    return Report(rep, md_path, json_path, plots)
