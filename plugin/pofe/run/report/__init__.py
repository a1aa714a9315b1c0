"""The run report: report.md + report-*.png + report.json in the run's output_dir.

Every number comes from the run's own files (`collect`), then goes to Markdown
(`markdown`) and PNG plots (`plots`). A section without data says so.

    axolotl pofe report recipe.yml      # (re)write the report of a run
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pofe.files import write_atomic
from pofe.run.folder import RunFolder
from pofe.run.guards import pofe_wrote
from pofe.run.report.cells import CLUSTERED, abstained, cut_at_user_turn, fmt, missing
from pofe.run.report.collect import collect
from pofe.run.report.held_out import not_evaluated, signed_ci, unclear, with_ci
from pofe.run.report.markdown import render_markdown
from pofe.run.report.plots import make_plots

REPORT_MD = "report.md"
REPORT_JSON = "report.json"


@dataclass
class Report:
    """A written report: its numbers, its files and its plots ({name: file name})."""

    data: dict
    markdown_path: Path
    json_path: Path
    plots: dict[str, str] = field(default_factory=dict)

    def terminal_summary(self) -> str:
        """A few lines for the terminal: per round, per model, cycles, where the report is."""
        rep = self.data
        lines = [
            f"POFE {rep['method'].upper()}: {rep['final_policy']} (pi_1) against its base (pi_0)"
            if rep.get("kind") == "trained"
            else f"POFE {rep['method'].upper()}: {rep['rounds_finished']} of {rep['rounds_planned']} rounds -> "
            f"{rep['final_policy']}"
        ]
        if rep.get("stopped"):
            lines.append(
                f"  STOPPED after round {rep['stopped']['after_round']} (pofe.stop_when): "
                + "; ".join(f["why"] for f in rep["stopped"]["fired"])
            )
        trained = rep.get("kind") == "trained"
        for r in rep["rounds"]:
            lines += _round_lines(r, "training" if trained else f"round {r['round']}")
        # a trained model has no candidates of its own to set beside it: the first line says what it is compared with
        if (rep["headline"] or {}).get("skipped") and not trained:
            lines.append(f"  no headline: {rep['headline']['skipped']}")
        lines += online_summary(rep.get("online"))
        lines += held_out_summary(rep)
        lines.append(f"  report: {self.markdown_path}")
        return "\n".join(lines)


def numbers(*fields: tuple[str, object], sep: str = ", ") -> str:
    """The fields that hold a number, each "name value", joined by `sep`: the console leaves a
    missing one out rather than dash it."""
    return sep.join(f"{name} {fmt(value)}" for name, value in fields if not missing(value))


def _round_lines(r: dict, label: str) -> list[str]:
    """A round's terminal line, of the numbers it has (none: no line), and its saturation warning."""
    cands, train, head = r["candidates"] or {}, r["train"] or {}, r["trained_on_train_prompts"]
    parts = [
        numbers(
            ("candidates mean", cands.get("mean_reward")),
            ("best-of-k", cands.get("best_of_k_reward")),
            ("policy samples", cands.get("policy_sample_mean_reward")),
        )
    ]
    if not missing(train.get("first_loss")):
        parts.append(f"loss {fmt(train['first_loss'])} -> {fmt(train['last_loss'])}")
    if head:
        parts.append(
            f"trained model {fmt(head['model_mean_reward'])} vs best-of-k "
            f"{fmt(head['candidates_best_of_k_reward'])} on {head['num_prompts']} of its prompts"
        )
    sat = cands.get("saturation") or {}
    if sat.get("prompts"):
        parts.append(f"saturated prompts {fmt(sat['saturated_share'])}")
    said = "; ".join(p for p in parts if p)
    lines = [f"  {label}: {said}"] if said else []
    if cands.get("saturation_warning"):
        lines.append(f"  {label}: SATURATED (see the report's Saturation section)")
    return lines


# an online training's refresh stats on the console: (key, name); each shown first -> last
# over the refreshes that measured it (judge2's: the monitored ones only)
ONLINE_CHANGES = (
    ("judge2_reward_mean", "judge2 reward"),
    ("preference", "preference over the mixture"),
    ("kl_to_pi_0", "KL to pi_0"),
)


def online_summary(online: dict | None) -> list[str]:
    """An online training's terminal line: its refreshes, first and last, of the stats it measured."""
    if online is None:
        return []
    refreshes = online["refreshes"]
    if not refreshes:
        return [f"  online: no finished refresh under {online['folder']}"]

    def change(key: str) -> str | None:
        values = [r[key] for r in refreshes if not missing(r.get(key))]
        return f"{fmt(values[0])} -> {fmt(values[-1])}" if values else None

    parts = []
    if change("candidate_reward_mean"):  # a scalar judge's
        best = change("candidate_reward_best")
        parts.append(f"candidate reward {change('candidate_reward_mean')}" + (f" (best-of-k {best})" if best else ""))
    parts += [f"{name} {change(key)}" for key, name in ONLINE_CHANGES if change(key)]
    first, last = refreshes[0], refreshes[-1]
    head = f"  online: {len(refreshes)} refreshes, steps {first['step']} -> {last['step']}"
    return [head + (": " + ", ".join(parts) if parts else "")]


def held_out_summary(rep: dict) -> list[str]:
    """The terminal summary's held-out lines: rewards and KL (and answers cut at a user turn), win
    rates against pi_0, the model to use (and how sure), win rates clustered at 1/2, cycles."""
    ev = rep["eval"]
    if not ev:
        return ["  no held-out evaluation"]
    names = [m["name"] for m in ev["models"]]
    none = [None] * len(names)
    per_model = [
        " ".join(
            said
            for said in (
                numbers(("reward", r)) + (abstained(ev, m) if not missing(r) else ""),
                numbers(("judge2 reward", r2)) + (abstained(ev, m, "_judge2") if not missing(r2) else ""),
                numbers(("KL", k)),
                cut_at_user_turn(ev, m),
            )
            if said
        )
        for m, (r, r2, k) in enumerate(
            zip(ev["mean_reward"] or none, ev.get("mean_reward_judge2") or none, ev["kl_to_pi_0"])
        )
    ]
    lines = []
    if any(per_model):
        lines.append(
            f"  {held_out_label(ev.get('decoding'))}: "
            + ", ".join(f"{n} {said}" if said else n for n, said in zip(names, per_model))
        )
    choice = rep.get("choice")
    # a scalar judge's run is chosen by reward: its Bradley-Terry win rates (near 1/2 by
    # construction) stay in report.md, off the console
    by_win_rate = not choice or choice["basis"] == "win_rate"
    if ev.get("vs_pi_0") and by_win_rate:
        lines.append(
            "  vs pi_0, raw / length-controlled: "
            + ", ".join(f"{names[m]} {fmt(v['raw'])} / {fmt(v['lc'])}" for m, v in enumerate(ev["vs_pi_0"]) if v)
        )
    if rep.get("eval_missing"):
        lines.append(f"  {not_evaluated(rep['eval_missing'])}")
    if choice:
        lines.append(
            f"  use {choice['name']} ({choice_reason(choice)})"
            + "".join(
                f"; {r['model']} {'REGRESSED' if r['clear'] else 'did not improve'} against {r['previous']}"
                for r in choice["regressions"]
            )
        )
    spread = ev["win_matrix_spread"]
    if len(names) > 1 and spread < CLUSTERED and by_win_rate:
        cluster = "is 1/2" if round(spread, 3) == 0 else f"within 0.5 ± {spread:.3f}"
        lines.append(f"  every win rate {cluster}: the report's 'Win rates' says why")
    if ev["cycles"]:
        lines.append(f"  CYCLE in the win-rate matrix: {ev['cycles']}")
    return lines


def held_out_label(decoding: dict | None) -> str:
    """What the held-out numbers are of: the models' sampled answers (`pofe.eval.temperature`,
    `num_samples` a prompt) or greedy ones, said apart from the demo's greedy answers on its
    training prompts. None: an eval.json from before it recorded its decoding."""
    if decoding is None:
        return "held-out prompts"
    if decoding["temperature"] == 0:
        return "held-out prompts, greedy answers"
    n = decoding["num_samples"]
    return f"held-out prompts, sampled answers ({n} a prompt at temperature {decoding['temperature']:g})"


def choice_reason(choice: dict) -> str:
    """The console's short why of the chosen model (the report's 'Which model to use' says more)."""
    if choice["basis"] == "reward":
        if choice["best"] == 0:
            return "no iterate has a higher mean held-out reward; chosen by reward, the judge scores each answer"
        return (
            f"best mean held-out reward {with_ci(choice['mean_reward'], choice['reward_ci95'])}, "
            f"{signed_ci(choice['diff_vs_pi_0'], choice['diff_ci95'])} over pi_0"
            + unclear(choice, ", not clearly")
            + "; chosen by reward, the judge scores each answer"
        )
    if choice["best"] == 0:
        return "no iterate beats it at equal length; chosen by win rate, the judge is pairwise"
    return (
        f"best length-controlled win rate against pi_0, {with_ci(choice['lc_vs_pi_0'], choice['lc_ci95'])}"
        + unclear(choice, ": not clearly above 1/2")
        + "; chosen by win rate, the judge is pairwise"
    )


def write_report(folder: RunFolder) -> Report:
    """Collect, plot and write report.md / report.json / report-*.png in folder.root."""
    rep = collect(folder)
    for stale in folder.root.glob("report-*.png"):
        if pofe_wrote(folder, stale):  # not a file that was there before the run (pofe.overwrite_output_dir)
            stale.unlink()
    plots = make_plots(rep, folder.root)
    md_path, json_path = folder.root / REPORT_MD, folder.root / REPORT_JSON
    write_atomic(json_path, json.dumps(rep, indent=2) + "\n")
    write_atomic(md_path, render_markdown(rep, plots) + "\n")
    return Report(rep, md_path, json_path, plots)
