"""Cycle detection and the report's handling of missing data (no model, no axolotl run)."""

from __future__ import annotations

import json

import pytest
import torch

from pofe.run.layout import RunLayout
from pofe.run.report import write_report
from pofe.run.report.collect import collect
from pofe.run.report.markdown import render_markdown
from pofe.run.tournament import find_cycles


def test_no_cycle_in_a_transitive_table():
    """pi_2 > pi_1 > pi_0 and pi_2 > pi_0: ordered, nothing to flag."""
    w = [[0.5, 0.4, 0.3],
         [0.6, 0.5, 0.45],
         [0.7, 0.55, 0.5]]
    assert find_cycles(w) == []


def test_the_cycle_of_the_brief_is_found_once():
    """pi_3 beats pi_2 (0.6), pi_2 beats pi_1 (0.7), but pi_1 beats pi_3 (0.55):
    the cycle 1 > 3 > 2 > 1, reported once, rotated to start at its smallest index."""
    w = torch.full((4, 4), 0.5)
    w[3, 2], w[2, 3] = 0.6, 0.4
    w[2, 1], w[1, 2] = 0.7, 0.3
    w[1, 3], w[3, 1] = 0.55, 0.45
    # pi_0 loses to everyone: no cycle through it
    for i in (1, 2, 3):
        w[i, 0], w[0, i] = 0.8, 0.2
    assert find_cycles(w) == [(1, 3, 2)]
    assert find_cycles(w.tolist()) == [(1, 3, 2)]


def test_threshold_and_ties():
    """A 'beat' needs W > threshold: 0.5 exactly is a tie and breaks the cycle, and a
    cycle of 0.55 wins disappears at threshold 0.6."""
    cyc = [[0.5, 0.55, 0.45], [0.45, 0.5, 0.55], [0.55, 0.45, 0.5]]  # 0 > 1 > 2 > 0
    assert find_cycles(cyc) == [(0, 1, 2)]
    assert find_cycles(cyc, threshold=0.6) == []
    tie = [[0.5, 0.55, 0.5], [0.45, 0.5, 0.55], [0.5, 0.45, 0.5]]
    assert find_cycles(tie) == []


def test_two_cycles_in_five_models():
    """Overrides 0 > 1 > 2 > 0 and 2 > 3 > 4 > 2; every other pair: higher index wins.

    Worked by hand: 1 beats only 2, and 2 beats 3, and 3 (higher) beats 1, so 1 > 2 > 3 > 1
    is a third cycle; no other triple closes (0 beats only 1; 4 beats 0, 1, 2 and loses
    to 3, and 2 does not beat 4)."""
    m = 5
    w = [[0.5] * m for _ in range(m)]
    for a in range(m):
        for b in range(m):
            if a > b:
                w[a][b], w[b][a] = 0.6, 0.4
    def beat(a, b):
        w[a][b], w[b][a] = 0.6, 0.4
    beat(0, 1); beat(1, 2); beat(2, 0); beat(2, 3); beat(3, 4); beat(4, 2)
    assert find_cycles(w) == [(0, 1, 2), (1, 2, 3), (2, 3, 4)]


def test_non_square_is_refused():
    with pytest.raises(ValueError, match="square"):
        find_cycles([[0.5, 0.5], [0.5]])


def test_report_without_rounds_or_eval_says_so(tmp_path):
    """A run whose state exists but has no finished stage: every section says 'no data'."""
    layout = RunLayout(tmp_path)
    layout.state.write_text(json.dumps({"method": "sppo", "rounds": {}, "stages": {}, "starts": [1.0],
                                        "rounds_planned": 2}))
    rep = write_report(layout)
    md = rep.markdown_path.read_text()
    assert "No round has started." in md
    assert "No held-out evaluation" in md
    assert rep.plots == {} and not list(tmp_path.glob("report-*.png"))
    assert json.loads(rep.json_path.read_text())["eval"] is None


def test_missing_state_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no run state"):
        collect(RunLayout(tmp_path))


def test_markdown_flags_a_cycle():
    ev = {
        "models": [{"name": f"pi_{i}", "path": "x"} for i in range(3)],
        "num_prompts": 2, "prompts_source": "p.jsonl",
        "decoding": {"num_samples": 1, "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 4},
        "judge": {"type": "python", "function": "m:f"}, "judge2": None,
        "win_matrix_method": "bradley_terry",
        "win_matrix": [[0.5, 0.4, 0.6], [0.6, 0.5, 0.4], [0.4, 0.6, 0.5]],
        "mean_reward": [0.1, 0.2, 0.3], "win_matrix_judge2": None, "mean_reward_judge2": None,
        "mean_response_tokens": [1.0, 2.0, 3.0], "mean_response_chars": [1.0, 2.0, 3.0],
        "kl_to_base": [0.0, 0.1, 0.2], "kl_is_unbiased": False, "perplexity": None,
        "reference_count": 0, "cycle_threshold": 0.5,
        "cycles": find_cycles([[0.5, 0.4, 0.6], [0.6, 0.5, 0.4], [0.4, 0.6, 0.5]]),
        "cycles_judge2": None,
    }
    rep = {"method": "sppo", "rounds_finished": 2, "rounds_planned": 2, "output_dir": "o",
           "final_policy": "p", "starts": 1, "rounds": [], "eval": ev}
    md = render_markdown(rep, {})
    assert "**CYCLE**: pi_0 > pi_2 > pi_1 > pi_0" in md
    assert "no reference responses" in md.lower()
    assert "not an unbiased KL" in md


def test_report_shows_each_rounds_win_rate_spread(tmp_path):
    """SPPO rounds carry summary.json's mean_win_rate_spread into report.json and a table
    column; a round without it (an older summary) shows '-'. RRHF's table has no such column."""
    layout = RunLayout(tmp_path)
    layout.state.write_text(json.dumps({"method": "sppo", "rounds": {"1": {}, "2": {}}, "stages": {},
                                        "starts": [1.0], "rounds_planned": 2}))
    summary = {"rows": 3, "candidates_per_prompt": {"mean": 5.0}, "mean_candidate_reward": 0.5,
               "mean_best_of_k_reward": 1.0, "mean_candidate_tokens": 7.0, "mean_best_win_rate": 0.9,
               "judge_abstentions": 0}
    for t, extra in ((1, {"mean_win_rate_spread": 0.25}), (2, {})):
        layout.candidates(t).mkdir(parents=True)
        (layout.candidates(t) / "summary.json").write_text(json.dumps({**summary, **extra}))
    rep = collect(layout)
    assert [r["candidates"]["win_rate_spread"] for r in rep["rounds"]] == [0.25, None]
    md = render_markdown(rep, {})
    header = next(line for line in md.splitlines() if line.startswith("| round |"))
    assert header.split(" | ")[3] == "cand. win-rate spread"
    cells = [line.split(" | ") for line in md.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert [c[3] for c in cells] == ["0.250", "-"]
    assert "'cand. win-rate spread': the mean over prompts of max - min win rate" in md
    rrhf = render_markdown({**rep, "method": "rrhf"}, {}).splitlines()
    assert "win-rate spread" not in next(line for line in rrhf if line.startswith("| round |"))
