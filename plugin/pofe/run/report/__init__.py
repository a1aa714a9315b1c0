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
from pofe.run.evaluation.statistics import distance_from_half
from pofe.run.folder import RunFolder
from pofe.run.guards import pofe_wrote
from pofe.run.report.cells import CLUSTERED, abstained, fmt
from pofe.run.report.collect import collect
from pofe.run.report.held_out import not_evaluated, signed_ci, unclear, with_ci
from pofe.run.report.markdown import render_markdown
from pofe.run.report.plots import make_plots
from pofe_candidates.win_rates import saturation_warning

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
        for r in rep["rounds"]:
            lines += _round_lines(r)
        if (rep["headline"] or {}).get("skipped"):
            lines.append(f"  no headline: {rep['headline']['skipped']}")
        lines += online_summary(rep.get("online"))
        lines += held_out_summary(rep)
        lines.append(f"  report: {self.markdown_path}")
        return "\n".join(lines)


def _round_lines(r: dict) -> list[str]:
    """A round's terminal line (and its saturation warning)."""
    cands, train, head = r["candidates"] or {}, r["train"] or {}, r["trained_on_train_prompts"]
    trained = (
        f"; trained model {fmt(head['model_mean_reward'])} vs best-of-k "
        f"{fmt(head['candidates_best_of_k_reward'])} on {head['num_prompts']} of its prompts"
        if head
        else ""
    )
    sat = cands.get("saturation") or {}
    saturated = f"; saturated prompts {fmt(sat['saturated_share'])}" if sat.get("prompts") else ""
    lines = [
        f"  round {r['round']}: candidates mean {fmt(cands.get('mean_reward'))}, best-of-k "
        f"{fmt(cands.get('best_of_k_reward'))}, policy samples {fmt(cands.get('policy_sample_mean_reward'))}; "
        f"loss {fmt(train.get('first_loss'))} -> {fmt(train.get('last_loss'))}{trained}{saturated}"
    ]
    if saturation_warning(sat, ""):
        lines.append(f"  round {r['round']}: SATURATED (see the report's Saturation section)")
    return lines


def online_summary(online: dict | None) -> list[str]:
    """An online training's terminal line: its refreshes, first and last."""
    if online is None:
        return []
    refreshes = online["refreshes"]
    if not refreshes:
        return [f"  online: no finished refresh under {online['folder']}"]
    first, last = refreshes[0], refreshes[-1]

    def change(key: str) -> str:
        return f"{fmt(first.get(key))} -> {fmt(last.get(key))}"

    return [
        f"  online: {len(refreshes)} refreshes, steps {first['step']} -> {last['step']}: candidate reward "
        f"{change('candidate_reward_mean')} (best-of-k {change('candidate_reward_best')}), "
        f"KL to pi_0 {change('kl_to_base')}"
    ]


def held_out_summary(rep: dict) -> list[str]:
    """The terminal summary's held-out lines: rewards and KL, win rates against pi_0, the model
    to use (and how sure), win rates clustered at 1/2, cycles."""
    ev = rep["eval"]
    if not ev:
        return ["  no held-out evaluation"]
    names = [m["name"] for m in ev["models"]]
    rewards = ev["mean_reward"] or [None] * len(names)
    lines = [
        "  held-out: "
        + ", ".join(
            f"{n} reward {fmt(r)}{abstained(ev, m)} KL {fmt(k)}"
            for m, (n, r, k) in enumerate(zip(names, rewards, ev["kl_to_base"]))
        )
    ]
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
    spread = distance_from_half(ev["win_matrix"])
    if len(names) > 1 and spread < CLUSTERED and by_win_rate:
        cluster = "is 1/2" if round(spread, 3) == 0 else f"within 0.5 ± {spread:.3f}"
        lines.append(f"  every win rate {cluster}: the report's 'Win rates' says why")
    if ev["cycles"]:
        lines.append(f"  CYCLE in the win-rate matrix: {ev['cycles']}")
    return lines


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
