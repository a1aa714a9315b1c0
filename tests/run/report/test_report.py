"""Cycle detection and the report's handling of missing data (no model, no axolotl run)."""

from __future__ import annotations

import json

import pytest
import torch

from pofe.run.evaluation.statistics import find_cycles
from pofe.run.folder import RoundRecord, RunFolder, RunState
from pofe.run.report import write_report
from pofe.run.report.collect import collect
from pofe.run.report.markdown import render_markdown
from pofe.run.report.plots import drift_plot, loss_plot, rewards_plot, winrate_plot
from tests.helpers import write_evaluation, write_headline, write_summary


def test_no_cycle_in_a_transitive_table():
    """pi_2 > pi_1 > pi_0 and pi_2 > pi_0: ordered, nothing to flag."""
    w = [[0.5, 0.4, 0.3], [0.6, 0.5, 0.45], [0.7, 0.55, 0.5]]
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

    for a, b in ((0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 2)):
        beat(a, b)
    assert find_cycles(w) == [(0, 1, 2), (1, 2, 3), (2, 3, 4)]


def test_non_square_is_refused():
    with pytest.raises(ValueError, match="square"):
        find_cycles([[0.5, 0.5], [0.5]])


def test_report_without_rounds_or_eval_says_so(tmp_path):
    """A run whose state exists but has no finished stage: every section says 'no data'."""
    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "sppo", starts=[1.0], rounds_planned=2).save()
    rep = write_report(folder)
    md = rep.markdown_path.read_text()
    assert "No round has started." in md
    assert "No held-out evaluation" in md
    assert rep.plots == {} and not list(tmp_path.glob("report-*.png"))
    assert json.loads(rep.json_path.read_text())["eval"] is None


def test_missing_state_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no run state"):
        collect(RunFolder(tmp_path))


def test_a_cut_eval_json_is_named_with_what_to_do(tmp_path):
    """Issue 33 (case 12, the runner's other JSON files): eval/eval.json cut short failed the
    report with a bare JSONDecodeError. Now the error names the file, where its JSON stops and
    the command that writes it again."""
    from pofe.files import UnreadableFile

    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "sppo", starts=[1.0], rounds_planned=2).save()
    folder.eval_dir.mkdir()
    (folder.eval_dir / "eval.json").write_text('{"models": [["pi_0", "/m/base"], ["pi_1", "/m/ro')
    with pytest.raises(UnreadableFile) as e:
        collect(folder)
    assert str(e.value) == (
        f"{folder.eval_dir / 'eval.json'} is not valid JSON (Unterminated string starting at: line 1, column 43): "
        "cut short or edited. The evaluation writes it: run `axolotl pofe eval` on the run's recipe again to "
        "rewrite it."
    )


def test_an_older_pofes_eval_json_is_refused_with_what_to_do(tmp_path):
    """An eval.json of an older POFE (KL to pi_0 under `kl_to_base`, no cycles or choice recorded)
    would show every model's KL as unmeasured and no choice; the report names the file, its form
    and the command that writes it again."""
    from pofe.files import UnreadableFile

    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "sppo", starts=[1.0], rounds_planned=2).save()
    folder.eval_dir.mkdir()
    (folder.eval_dir / "eval.json").write_text(json.dumps({"models": [], "kl_to_base": [0.0, 0.5]}))
    with pytest.raises(UnreadableFile) as e:
        collect(folder)
    assert str(e.value) == (
        f"{folder.eval_dir / 'eval.json'} is in another form than this POFE reads (format 1, unrecorded, this "
        "one reads 2: an older POFE wrote it). The evaluation writes it: run `axolotl pofe eval` on the run's recipe again to rewrite it."
    )


def test_markdown_flags_a_cycle():
    ev = {
        "models": [{"name": f"pi_{i}", "path": "x"} for i in range(3)],
        "num_prompts": 2,
        "prompts_source": "p.jsonl",
        "decoding": {"num_samples": 1, "temperature": 0.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 4},
        "judge": {"type": "python", "function": "m:f"},
        "judge2": None,
        "win_matrix_method": "bradley_terry",
        "win_matrix": [[0.5, 0.4, 0.6], [0.6, 0.5, 0.4], [0.4, 0.6, 0.5]],
        "mean_reward": [0.1, 0.2, 0.3],
        "win_matrix_judge2": None,
        "mean_reward_judge2": None,
        "mean_response_tokens": [1.0, 2.0, 3.0],
        "mean_response_chars": [1.0, 2.0, 3.0],
        "kl_to_pi_0": [0.0, 0.1, 0.2],
        "kl_is_unbiased": False,
        "perplexity": None,
        "reference_count": 0,
        "cycle_threshold": 0.5,
        "cycles": find_cycles([[0.5, 0.4, 0.6], [0.6, 0.5, 0.4], [0.4, 0.6, 0.5]]),
        "cycles_judge2": None,
    }
    ev = recorded(ev)
    rep = {
        "method": "sppo",
        "rounds_finished": 2,
        "rounds_planned": 2,
        "output_dir": "o",
        "final_policy": "p",
        "starts": 1,
        "rounds": [],
        "eval": ev,
    }
    md = render_markdown(rep, {})
    assert "**CYCLE**: pi_0 > pi_2 > pi_1 > pi_0" in md
    assert "no reference responses" in md.lower()
    assert "not an unbiased KL" in md


def test_report_shows_each_rounds_win_rate_spread(tmp_path):
    """SPPO rounds carry summary.json's mean_win_rate_spread into report.json and a table
    column; a round without one (no judged row) shows '-'. RRHF's table has no such column."""
    folder = RunFolder(tmp_path)
    rounds = {"1": RoundRecord(), "2": RoundRecord()}
    RunState(folder.state, "r.yml", "f", "sppo", rounds=rounds, starts=[1.0], rounds_planned=2).save()
    summary = {
        "rows": 3,
        "candidates_per_prompt": {"mean": 5.0, "min": 5, "max": 5},
        "mean_candidate_reward": 0.5,
        "mean_best_of_k_reward": 1.0,
        "mean_candidate_tokens": 7.0,
        "mean_best_win_rate": 0.9,
    }
    for t, spread in ((1, 0.25), (2, None)):
        write_summary(folder, t, **summary, mean_win_rate_spread=spread)
    rep = collect(folder)
    assert [r["candidates"]["win_rate_spread"] for r in rep["rounds"]] == [0.25, None]
    md = render_markdown(rep, {})
    header = next(line for line in md.splitlines() if line.startswith("| round |"))
    assert header.split(" | ")[3] == "cand. win-rate spread"
    rounds_table = md.split("## Rounds")[1].split("\n## ")[0]  # (the reproducibility table's rows start so too)
    cells = [line.split(" | ") for line in rounds_table.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert [c[3] for c in cells] == ["0.250", "-"]
    assert "'cand. win-rate spread': the mean over prompts of max - min win rate" in md
    rrhf = render_markdown({**rep, "method": "rrhf"}, {}).splitlines()
    assert "win-rate spread" not in next(line for line in rrhf if line.startswith("| round |"))


def test_report_shows_each_rounds_saturation(tmp_path):
    """summary.json's saturation per round: a table (prompts, saturated with its share, mean
    |w - 1/2|) and, for round 2 (3 of 4 saturated, above half), a warning naming the remedies,
    in report.md and the terminal summary; a round without it (a method on rewards) has no row."""
    folder = RunFolder(tmp_path)
    rounds = {str(t): RoundRecord() for t in (1, 2, 3)}
    RunState(folder.state, "r.yml", "f", "sppo", rounds=rounds, starts=[1.0], rounds_planned=3).save()
    sat = {"band": 0.05, "prompts": 4, "saturated_prompts": 1, "saturated_share": 0.25, "mean_abs_deviation": 0.2}
    per_round = {1: sat, 2: {**sat, "saturated_prompts": 3, "saturated_share": 0.75, "mean_abs_deviation": 0.03}}
    for t in (1, 2, 3):
        write_summary(folder, t, rows=4, saturation=per_round.get(t))
    rep = write_report(folder)
    assert [r["candidates"]["saturation"] for r in rep.data["rounds"]] == [per_round[1], per_round[2], None]
    md = rep.markdown_path.read_text()
    section = md.split("### Saturation")[1].split("\n### ")[0]
    assert "| 1 | 4 | 1 (25.0 %) | 0.200 |" in section and "| 2 | 4 | 3 (75.0 %) | 0.030 |" in section
    assert "| 3 |" not in section
    assert "**Round 2: 3 of 4 prompts (75%, above 50%) are saturated" in section
    assert "Round 1:" not in section and "stronger judge" in section
    terminal = rep.terminal_summary()
    assert "round 2: SATURATED" in terminal and "round 1: SATURATED" not in terminal


def test_pairwise_run_headline_is_each_rounds_win_rates(tmp_path):
    """A pairwise-judged run has no reward headline: the report's headline is each round's
    win rate against pi_0 and against pi_{t-1}, raw and length-controlled with intervals,
    the numbers of eval.json's `vs_pi_0` / `vs_previous`; the lengths plot is drawn."""
    from pofe.run.evaluation.statistics import compare_iterates
    from pofe.run.report.markdown import fmt
    from pofe_candidates.win_rates import bradley_terry_preferences

    g = torch.Generator().manual_seed(0)
    P, M, S = 12, 3, 2
    tokens = torch.randint(1, 30, (P, M, S), generator=g).double()
    pref = bradley_terry_preferences(torch.randn(P, M * S, generator=g, dtype=torch.float64))
    comparisons = compare_iterates(pref, tokens, seed=0)
    # raw: the mean over prompts and sample pairs, by a plain loop
    by_hand = sum(pref[p, 2 * S + i, 0 * S + j].item() for p in range(P) for i in range(S) for j in range(S))
    assert comparisons["vs_pi_0"][2]["raw"] == pytest.approx(by_hand / (P * S * S))
    ev = {
        "models": [{"name": f"pi_{i}", "path": "x"} for i in range(M)],
        "num_prompts": P,
        "prompts_source": "p.jsonl",
        "decoding": {"num_samples": S, "temperature": 1.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 4},
        "judge": {"type": "python_pairwise", "function": "m:f"},
        "judge2": None,
        "win_matrix_method": "pairwise",
        "win_matrix": [[0.5] * M] * M,
        "mean_reward": None,
        "win_matrix_judge2": None,
        "mean_reward_judge2": None,
        "mean_response_tokens": comparisons["response_tokens"]["mean"],
        "mean_response_chars": [1.0] * M,
        "kl_to_pi_0": [0.0] * M,
        "kl_is_unbiased": True,
        "perplexity": None,
        "reference_count": 0,
        "cycle_threshold": 0.5,
        **comparisons,
    }
    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "sppo", starts=[1.0], rounds_planned=2).save()
    ev = write_evaluation(folder, ev)
    write_headline(folder, skipped="the judge is pairwise")
    rep = write_report(folder)
    md = rep.markdown_path.read_text()
    headline = md[md.index("## Headline") : md.index("## Rounds")]
    assert "No reward headline: the judge is pairwise." in headline
    for t in (1, 2):
        base, prev = ev["vs_pi_0"][t], ev["vs_previous"][t]
        cells = [
            f"{fmt(v[k])} [{fmt(v[k + '_ci95'][0])}, {fmt(v[k + '_ci95'][1])}]"
            for v in (base, prev)
            for k in ("raw", "lc")
        ]
        assert f"| {t} | pi_{t} | " + " | ".join(cells) + " |" in headline
    assert ev["vs_previous"][1] == ev["vs_pi_0"][1]  # pi_1's previous iterate is pi_0
    assert rep.plots["lengths"] == "report-lengths.png" and (tmp_path / "report-lengths.png").exists()
    assert "### Better, or only longer?" in md


def test_a_constructed_regression_is_flagged_and_the_best_round_chosen():
    """pi_1 gains at equal length, pi_2 falls clearly below pi_1, pi_3 slips within noise:
    pi_1 is the model to use, pi_2 REGRESSED, pi_3 did not improve."""
    from pofe.run.evaluation.decision import choose_model
    from pofe.run.report.markdown import choice_section

    def v(lc, lo, hi):
        return {"raw": lc + 0.1, "raw_ci95": [lo, hi], "lc": lc, "lc_ci95": [lo, hi], "length_slope": 0.0}

    ev = {
        "models": [{"name": f"pi_{i}"} for i in range(4)],
        "vs_pi_0": [None, v(0.70, 0.6, 0.8), v(0.55, 0.45, 0.65), v(0.50, 0.4, 0.6)],
        "vs_previous": [None, v(0.70, 0.6, 0.8), v(0.30, 0.2, 0.4), v(0.45, 0.35, 0.55)],
    }
    ev = recorded(ev)
    choice = choose_model(ev)
    assert (choice["best"], choice["name"], choice["lc_vs_pi_0"]) == (1, "pi_1", 0.70)
    assert [(r["model"], r["clear"]) for r in choice["regressions"]] == [("pi_2", True), ("pi_3", False)]
    md = "\n".join(choice_section({"choice": choice}))
    assert (
        "**pi_1**: the highest length-controlled win rate against pi_0 on the held-out prompts "
        "(0.700 [0.600, 0.800]; raw 0.800)."
        in md
        and choice["clear"]
    )
    assert "- pi_2 REGRESSED against pi_1: length-controlled win rate 0.300 [0.200, 0.400]." in md
    assert "- pi_3 did not improve (within noise) against pi_2" in md
    # no iterate beats the base at equal length: the base is the model to use
    worse = {**ev, "vs_pi_0": [None, v(0.4, 0.3, 0.5), v(0.45, 0.4, 0.5), v(0.3, 0.2, 0.4)]}
    assert choose_model(worse)["name"] == "pi_0"
    noisy = {**ev, "vs_pi_0": [None, v(0.55, 0.45, 0.65), v(0.5, 0.4, 0.6), v(0.3, 0.2, 0.4)]}
    assert not choose_model(noisy)["clear"]
    assert "not clearly better than pi_0" in "\n".join(choice_section({"choice": choose_model(noisy)}))
    assert choose_model(None) is None and choose_model({"models": [], "win_matrix": []}) is None


def recorded(ev: dict) -> dict:
    """A hand-made eval.json as the evaluation writes it: with its readings (cycles, spreads, the
    choice) and format (`with_readings`); cycle_threshold at its default unless given."""
    from pofe.run.evaluation.records import with_readings

    return with_readings({"cycle_threshold": 0.5, **ev})


def averaged_eval() -> dict:
    """eval.json of pi_0, pi_1, pi_2 and pi_avg on 8 prompts x 2 samples, pi_avg answering best
    (rewards + 2), pi_2's KL to pi_0 (1.5) over the ceiling 1.0."""
    from pofe.run.evaluation.statistics import compare_iterates
    from pofe_candidates.win_rates import bradley_terry_preferences

    g = torch.Generator().manual_seed(0)
    P, M, S = 8, 4, 2
    tokens = torch.randint(1, 30, (P, M, S), generator=g).double()
    rewards = torch.randn(P, M * S, generator=g, dtype=torch.float64)
    rewards[:, 3 * S :] += 2.0  # pi_avg answers best

    comparisons = compare_iterates(bradley_terry_preferences(rewards), tokens, seed=0)
    return recorded(
        {
            "models": [{"name": n, "path": "x"} for n in ("pi_0", "pi_1", "pi_2", "pi_avg")],
            "num_prompts": P,
            "prompts_source": "p.jsonl",
            "decoding": {"num_samples": S, "temperature": 1.0, "top_p": 1.0, "seed": 0, "max_new_tokens": 4},
            "judge": {"type": "python", "function": "m:f"},
            "judge2": None,
            "win_matrix_method": "bradley_terry",
            "win_matrix": [[0.5] * M] * M,
            "mean_reward": [0.1, 0.2, 0.3, 0.5],
            "win_matrix_judge2": None,
            "mean_reward_judge2": None,
            "mean_response_tokens": comparisons["response_tokens"]["mean"],
            "mean_response_chars": [1.0] * M,
            "kl_to_pi_0": [0.0, 0.6, 1.5, 0.9],
            "kl_is_unbiased": True,
            "perplexity": None,
            "reference_count": 0,
            "cycle_threshold": 0.5,
            "average": {"index": 3, "of": ["pi_1", "pi_2"]},
            "kl_ceiling": 1.0,
            **comparisons,
        }
    )


def test_report_names_pi_avg_and_the_kl_ceiling(tmp_path):
    """eval.json with pi_avg (models pi_0, pi_1, pi_2, pi_avg) and a KL ceiling 1.0 that pi_2 (KL
    1.5) passes: the choice is pi_avg (lc 0.8 against pi_0, KL 0.9), said to average pi_1 and
    pi_2; pi_2 is listed as over the ceiling; the win-rate table's row for pi_avg reads "avg";
    the drift, lengths and rewards plots are drawn with pi_avg apart from the rounds' axis."""
    from pofe.run.evaluation.decision import choose_model
    from pofe.run.report.held_out import choice_section, length_section

    ev = averaged_eval()
    choice = choose_model(ev)
    assert choice["name"] == "pi_avg" and choice["over_kl_ceiling"] == ["pi_2"]
    md = "\n".join(choice_section({"choice": choice, "eval": ev}))
    assert "**pi_avg**: the highest length-controlled win rate against pi_0" in md
    assert "pi_avg is the average of pi_1, pi_2's weights." in md
    assert "- Not chosen, over the KL ceiling 1.0 (`pofe.stop_when.kl_to_pi_0_above`): pi_2." in md
    lengths = "\n".join(length_section(ev))
    assert "| avg | pi_avg | " in lengths and "| 2 | pi_2 | " in lengths
    assert "Row avg: pi_avg, the average of pi_1, pi_2's weights" in lengths
    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "sppo", starts=[1.0], rounds_planned=2).save()
    write_evaluation(folder, ev)
    rep = write_report(folder)
    assert rep.data["choice"]["name"] == "pi_avg"
    assert {"drift", "lengths", "rewards", "winrate"} <= set(rep.plots)


def test_a_model_the_evaluation_has_not_seen_is_never_passed_over(tmp_path):
    """Three rounds finished, eval.json written when two had (pi_0..pi_2 and pi_avg): the report
    names no model to use (pi_avg would be chosen from what eval.json holds), and says which
    model is missing and what to run, in report.md and on the terminal. Once pi_3 is evaluated the
    choice is back."""
    folder = RunFolder(tmp_path)
    rounds = {str(t): RoundRecord(policy_out=f"round-{t}/merged") for t in (1, 2, 3)}
    RunState(folder.state, "r.yml", "f", "sppo", rounds=rounds, starts=[1.0], rounds_planned=3).save()
    write_evaluation(folder, averaged_eval())
    rep = write_report(folder)
    said = (
        "Not decided: eval/eval.json has no held-out answers of pi_3, which finished after it was written. "
        "Run `axolotl pofe eval <recipe>`, then `axolotl pofe report <recipe>`."
    )
    assert rep.data["choice"] is None and rep.data["eval_missing"] == ["pi_3"]
    assert f"## Which model to use\n\n{said}\n" in (tmp_path / "report.md").read_text()
    assert f"  {said}" in rep.terminal_summary().splitlines()
    assert "use pi_" not in rep.terminal_summary()
    del rounds["3"]
    RunState(folder.state, "r.yml", "f", "sppo", rounds=rounds, starts=[1.0], rounds_planned=3).save()
    assert write_report(folder).data["choice"]["name"] == "pi_avg"


def test_report_says_the_anchor_was_mixed_toward_pi_0(tmp_path):
    """A run whose round recipes set pofe.anchor_mix says so under the rounds table, naming beta
    and pi_0 (the recipe's pi_0); a run without it says nothing of the kind."""
    import yaml

    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "sppo", rounds={"1": RoundRecord()}, starts=[1.0], rounds_planned=1).save()
    folder.round_dir(1).mkdir(parents=True)
    recipe = {"seed": 0, "pofe": {"anchor_mix": 0.2, "pi_0": "/m/sft"}}
    folder.recipe(1).write_text(yaml.safe_dump(recipe))
    md = write_report(folder).markdown_path.read_text()
    assert "Each round's anchor was (1 - 0.2) log pi_t + 0.2 log pi_0 (`pofe.anchor_mix`: 0.2), pi_0 = `/m/sft`" in md
    folder.recipe(1).write_text(yaml.safe_dump({"seed": 0, "pofe": {}}))
    assert "anchor was" not in write_report(folder).markdown_path.read_text()


def round_files(folder: RunFolder, t: int, global_step: int, logged: dict[int, dict]) -> None:
    """Round t's trainer_state.json as the Trainer writes it: `global_step` steps run, the log
    entries of the steps in `logged`."""
    history = [{"step": step, **entry} for step, entry in logged.items()]
    folder.trainer_state(t).parent.mkdir(parents=True, exist_ok=True)
    folder.trainer_state(t).write_text(json.dumps({"global_step": global_step, "log_history": history}))


def test_steps_are_the_steps_run_not_the_last_logged(tmp_path):
    """24 steps run, logged every 10: the report's steps column says 24, not 20, and the loss
    curve of the next round starts after step 24."""
    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "rrhf", rounds={"1": RoundRecord(), "2": RoundRecord()}, starts=[1.0]).save()
    round_files(folder, 1, 24, {10: {"loss": 2.0, "rrhf/rank_accuracy": 0.5}, 20: {"loss": 1.0}})
    round_files(folder, 2, 3, {3: {"loss": 0.5}})
    rep = collect(folder)
    assert [r["train"]["steps"] for r in rep["rounds"]] == [24, 3]
    rounds_table = render_markdown(rep, {}).split("## Rounds")[1].split("\n## ")[0]
    assert [line.split(" | ")[6] for line in rounds_table.splitlines() if line.startswith(("| 1 |", "| 2 |"))] == [
        "24",
        "3",
    ]
    fig = loss_plot(rep)
    assert [list(line.get_xdata()) for line in fig.axes[0].lines if line.get_label().startswith("round")] == [
        [10, 20],
        [27],
    ]
    # issue 44: both panels drawn from 0 (a rank accuracy of 0.5 alone is not zoomed to fill the panel)
    assert fig.axes[0].get_ylim()[0] == 0 and fig.axes[1].get_ylim()[0] == 0 < 0.5 < fig.axes[1].get_ylim()[1]


def test_few_points_get_markers_and_an_empty_panel_says_why(tmp_path):
    """One logged step per round (a one-step run): each round's loss is a single point, drawn
    with a marker (a line of one point is invisible); no rank accuracy in the logs: the panel
    says so instead of staying blank. Dotted lines mark where rounds 2 and 3 start."""
    folder = RunFolder(tmp_path)
    rounds = {str(t): RoundRecord() for t in (1, 2, 3)}
    RunState(folder.state, "r.yml", "f", "rrhf", rounds=rounds, starts=[1.0]).save()
    for t in (1, 2, 3):
        round_files(folder, t, 1, {1: {"loss": 1.0 / t}})
    fig = loss_plot(collect(folder))
    curves = [line for line in fig.axes[0].lines if line.get_label().startswith("round")]
    assert [(list(c.get_xdata()), c.get_marker()) for c in curves] == [([1], "o"), ([2], "s"), ([3], "^")]
    assert sorted(line.get_xdata()[0] for line in fig.axes[0].lines if line.get_linestyle() == ":") == [1.5, 2.5]
    assert [t.get_text() for t in fig.axes[1].texts] == ["no rrhf/rank_accuracy in the trainer's logs"]


def test_a_run_shorter_than_logging_steps_is_reported_as_such(tmp_path):
    """One step run, logging every 10: the round's training is in the report (1 step, no loss:
    '-'), and the loss plot says why it has no curve instead of the report saying there is no
    trainer_state.json."""
    folder = RunFolder(tmp_path)
    RunState(folder.state, "r.yml", "f", "rrhf", rounds={"1": RoundRecord()}, starts=[1.0]).save()
    round_files(folder, 1, 1, {})
    state = json.loads(folder.trainer_state(1).read_text())
    folder.trainer_state(1).write_text(json.dumps({**state, "logging_steps": 10}))
    rep = collect(folder)
    assert rep["rounds"][0]["train"] | {"curves": None} == {
        "steps": 1,
        "max_steps": None,
        "logging_steps": 10,
        "first_loss": None,
        "last_loss": None,
        "diagnostic": "rrhf/rank_accuracy",
        "diagnostic_first": None,
        "diagnostic_last": None,
        "curves": None,
    }
    fig = loss_plot(rep)
    assert [t.get_text() for ax in fig.axes for t in ax.texts] == [
        "nothing logged: logging_steps 10,\nsteps run (round 1: 1)"
    ] * 2


def test_overlapping_series_stay_apart_and_the_legend_is_off_the_data(tmp_path):
    """Three reward series equal to 0 in every round (as a toy run's first rounds give): each
    has its own marker and line style, markers of decreasing size (one drawn over the other
    shows both), and the legend, drawn, lies below the axes."""
    rounds = [
        {
            "round": t,
            "candidates": {"mean_reward": 0.0, "best_of_k_reward": 1.0, "policy_sample_mean_reward": 0.0},
            "trained_on_train_prompts": {"model_mean_reward": 0.0},
        }
        for t in (1, 2)
    ]
    fig = rewards_plot({"rounds": rounds, "eval": None})
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 4
    styles = [(line.get_marker(), line.get_linestyle()) for line in lines]
    assert len(set(styles)) == 4
    sizes = [line.get_markersize() for line in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 4
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend, axes_box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.y1 <= axes_box.y0  # below the axes, not over the data


def eval_record(w: list[list[float]], method: str = "bradley_terry") -> dict:
    """eval.json's fields the win-rate sections read, for the matrix `w` (`recorded` adds the readings)."""
    m = len(w)
    return {
        "models": [{"name": f"pi_{i}", "path": "x"} for i in range(m)],
        "win_matrix_method": method,
        "win_matrix": w,
        "win_matrix_judge2": None,
    }


def test_win_rates_clustered_at_one_half_are_explained():
    """All within 0.5 +- 0.004 (Bradley-Terry over rewards of a [0, 1] verifier that differ by
    ~0.016): the report says why and what to do; a pairwise judge's clustered matrix names
    saturation; rates that spread (0.1 from 1/2) get no note. The heat map of the clustered
    one spans 0.5 +- 0.004, not 0..1 (else every cell is the same white), with 3 decimals."""
    from pofe.run.report.held_out import win_rate_sections

    clustered = [[0.5, 0.498, 0.496], [0.502, 0.5, 0.499], [0.504, 0.501, 0.5]]
    md = "\n".join(win_rate_sections(recorded(eval_record(clustered)), [f"pi_{i}" for i in range(3)]))
    assert "Every win rate lies within 0.5 ± 0.004. Bradley-Terry turns a reward gap into a win probability" in md
    assert "a gap of 0.1 is 0.525" in md and "`pofe.eval.judge2`" in md
    pairwise = "\n".join(
        win_rate_sections(recorded(eval_record(clustered, "pairwise")), [f"pi_{i}" for i in range(3)])
    )
    assert "The pairwise judge rarely prefers" in pairwise and "Bradley-Terry" not in pairwise
    spread = [[0.5, 0.4, 0.6], [0.6, 0.5, 0.4], [0.4, 0.6, 0.5]]
    assert "Every win rate lies within" not in "\n".join(
        win_rate_sections(recorded(eval_record(spread)), ["a", "b", "c"])
    )

    # issue 44: the colours span 0..1 whatever the spread (a scale zoomed to 0.5 +- 0.004 painted
    # 0.499 dark red and repeated its colour-bar labels), the cells keep 3 decimals
    fig = winrate_plot(recorded(eval_record(clustered)))
    assert fig.axes[0].images[0].get_clim() == pytest.approx((0.0, 1.0))
    assert "0.504" in [t.get_text() for t in fig.axes[0].texts]
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert labels == ["0.00", "0.25", "0.50", "0.75", "1.00"]
    assert winrate_plot(recorded(eval_record(spread))).axes[0].images[0].get_clim() == pytest.approx((0.0, 1.0))


def test_the_judges_identity_is_cut_as_the_table_says():
    """A python judge's module digest (sha256, 64 hex) and a hub model's commit (40 hex) are shown
    cut to 12, as the table's other digests; an LLM judge has no identity to show."""
    from pofe.run.report.markdown import identity_cell

    sha, commit = "0123456789ab" + "c" * 52, "fedcba987654" + "3" * 28
    assert identity_cell({"pofe.demo.task:reward": sha}) == "pofe.demo.task:reward 0123456789ab"
    assert identity_cell({"org/rm": f"commit {commit}"}) == "org/rm commit fedcba987654"
    assert identity_cell({}) == "a served model, known by name only"
    assert identity_cell(None) == "-"


def headline_report(method: str) -> dict:
    """A one-round report with a headline, of `method`."""
    head = {
        "num_prompts": 3,
        "policy_sample_mean_reward": 0.1,
        "candidates_mean_reward": 0.2,
        "candidates_best_of_k_reward": 1.0,
        "model_mean_reward": 0.6,
        "samples": [],
    }
    return {
        "method": method,
        "rounds": [{"round": 1, "trained_on_train_prompts": head}],
        "headline": {
            "skipped": None,
            "train_prompts": 3,
            "judge": {"type": "python"},
            "decoding": {"temperature": 0.0, "top_p": 1.0, "seed": 0, "num_samples": 1, "max_new_tokens": 4},
        },
    }


def test_the_headline_speaks_of_its_own_method():
    """RRHF's headline says its model tends to best-of-k; SPPO's says what SPPO does with its
    candidates and never names RRHF."""
    from pofe.run.report.markdown import headline_section

    rrhf = "\n".join(headline_section(headline_report("rrhf")))
    sppo = "\n".join(headline_section(headline_report("sppo")))
    assert "RRHF's trained model tends to that best-of-k reward" in rrhf
    assert "RRHF" not in sppo and "SPPO moves each candidate's log-probability towards eta times" in sppo
    assert "| 1 | 3 | 0.100 | 0.200 | 1.000 | 0.600 | -0.400 |" in sppo


def test_the_terminal_says_how_sure_the_choice_is():
    """pi_1's length-controlled win rate against pi_0 is 0.504 with an interval holding 1/2, and
    every win rate is within 0.5 +- 0.004: the summary names pi_1, its rate and interval, that it
    is not clearly above 1/2, and that the report says why the rates cluster."""
    from pofe.run.evaluation.decision import choose_model
    from pofe.run.report import held_out_summary

    lc = {"raw": 0.502, "raw_ci95": [0.49, 0.51], "lc": 0.504, "lc_ci95": [0.49, 0.52], "length_slope": 0.0}
    ev = {
        **eval_record([[0.5, 0.496], [0.504, 0.5]]),
        "mean_reward": [0.1, 0.12],
        "kl_to_pi_0": [0.0, 0.5],
        "vs_pi_0": [None, lc],
        "vs_previous": [None, lc],
    }
    ev = recorded(ev)
    rep = {"eval": ev, "choice": choose_model(ev)}
    assert held_out_summary(rep)[2:] == [
        "  use pi_1 (best length-controlled win rate against pi_0, 0.504 [0.490, 0.520]: not clearly above 1/2; "
        "chosen by win rate, the judge is pairwise)",
        "  every win rate within 0.5 ± 0.004: the report's 'Win rates' says why",
    ]


def test_a_scalar_judges_choice_is_by_reward_and_says_why():
    """The report and the console name the model by its mean held-out reward, with the paired
    difference to pi_0 and its interval, and say why: the judge scores each answer."""
    from pofe.run.evaluation.decision import choose_model
    from pofe.run.report import held_out_summary
    from pofe.run.report.held_out import choice_section

    ev = {
        **eval_record([[0.5, 0.49], [0.51, 0.5]]),
        "judge": {"type": "python"},
        "mean_reward": [0.2, 0.45],
        "kl_to_pi_0": [0.0, 0.5],
        "vs_pi_0": [None, {"raw": 0.51, "raw_ci95": [0.5, 0.52], "lc": 0.51, "lc_ci95": [0.49, 0.53]}],
        "vs_previous": [None, {"raw": 0.51, "raw_ci95": [0.5, 0.52], "lc": 0.51, "lc_ci95": [0.49, 0.53]}],
        "reward_ci95": [[0.1, 0.3], [0.35, 0.55]],
        "reward_vs_pi_0": [None, {"diff": 0.25, "diff_ci95": [0.125, 0.375]}],
        "reward_vs_previous": [None, {"diff": 0.25, "diff_ci95": [0.125, 0.375]}],
    }
    ev = recorded(ev)
    rep = {"eval": ev, "choice": choose_model(ev)}
    md = "\n".join(choice_section(rep))
    assert (
        "**pi_1**: the highest mean reward on the held-out prompts (0.450 [0.350, 0.550]), +0.250 "
        "[+0.125, +0.375] over pi_0's." in md
    )
    assert "Chosen by mean held-out reward: the judge `python` scores each answer on its own (pointwise)" in md
    # the console's lines after the held-out rewards: the choice alone, no Bradley-Terry win rates
    # near 1/2 (0.51 against pi_0, every rate within 0.5 +- 0.01) beside a choice made by reward
    assert held_out_summary(rep)[1:] == [
        "  use pi_1 (best mean held-out reward 0.450 [0.350, 0.550], +0.250 [+0.125, +0.375] over pi_0; "
        "chosen by reward, the judge scores each answer)"
    ]


def test_length_and_drift_axes_start_at_zero():
    """Issue 44: mean tokens of 3.82 and 3.94 drawn on a 3.82-3.94 axis looked like a large
    change; the axis now includes 0 (KL too, perplexity too)."""
    ev = {
        **eval_record([[0.5, 0.5], [0.5, 0.5]]),
        "mean_response_tokens": [3.82, 3.94],
        "kl_to_pi_0": [0.0, 0.02],
        "perplexity": [5.1, 5.0],
    }
    ev = recorded(ev)
    fig = drift_plot(ev)
    for ax in fig.axes:
        lo, hi = ax.get_ylim()
        assert lo <= 0 < hi
    assert fig.axes[0].get_ylim()[1] < 5  # 3.94 and 8 % above it


def _summary(rep: dict) -> list[str]:
    from pathlib import Path

    from pofe.run.report import Report

    base = {"stopped": None, "headline": None, "online": None, "eval": None, "eval_missing": [], "choice": None}
    return Report({**base, **rep}, Path("out/report.md"), Path("out/report.json")).terminal_summary().splitlines()


def test_the_console_summary_of_a_trained_online_model_shows_only_the_numbers_it_has():
    """Online Nash-MD with a pairwise judge, trained by `axolotl train` and evaluated: no candidates of
    its own (no round fields, no headline line), its loss first -> last; the refreshes' preference
    over the mixture, judge2's reward of the two monitored ones (steps 0 and 6) and KL to pi_0, no
    scalar candidate reward; held out, judge2's rewards and the KL, the pairwise judge's none."""
    from pofe.run.evaluation.trained import NO_HEADLINE

    refreshes = [
        {"step": 0, "preference": 0.5, "judge2_reward_mean": 0.25, "kl_to_pi_0": 0.0},
        {"step": 3, "preference": 0.55, "kl_to_pi_0": 0.25},
        {"step": 6, "preference": 0.625, "judge2_reward_mean": 0.125, "kl_to_pi_0": 0.5},
    ]
    lc = {"raw": 0.6, "raw_ci95": [0.5, 0.7], "lc": 0.625, "lc_ci95": [0.5, 0.75]}
    ev = {
        **eval_record([[0.5, 0.4], [0.6, 0.5]], "pairwise"),
        "mean_reward": None,
        "mean_reward_judge2": [0.25, 0.375],
        "kl_to_pi_0": [0.0, 0.5],
        "vs_pi_0": [None, lc],
        "vs_previous": [None, lc],  # pi_1's previous model is pi_0
        "decoding": {"num_samples": 1, "temperature": 0.0},
    }
    ev = recorded(ev)
    round_1 = {"round": 1, "candidates": None, "train": {"first_loss": 63.99, "last_loss": 63.609}}
    rep = {
        "kind": "trained",
        "method": "nash_md",
        "final_policy": "out",
        "rounds": [{**round_1, "trained_on_train_prompts": None}],
        "headline": {"skipped": NO_HEADLINE},
        "online": {"folder": "out/online", "refreshes": refreshes},
        "eval": ev,
    }
    assert _summary(rep) == [
        "POFE NASH_MD: out (pi_1) against its base (pi_0)",
        "  training: loss 63.990 -> 63.609",
        "  online: 3 refreshes, steps 0 -> 6: judge2 reward 0.250 -> 0.125, preference over the mixture 0.500 -> "
        "0.625, KL to pi_0 0.000 -> 0.500",
        "  held-out prompts, greedy answers: pi_0 judge2 reward 0.250 KL 0.000, pi_1 judge2 reward 0.375 KL 0.500",
        "  vs pi_0, raw / length-controlled: pi_1 0.600 / 0.625",
        "  report: out/report.md",
    ]


def test_the_console_summary_of_rounds_leaves_out_what_a_round_has_not_measured():
    """Round 1 made its candidates from the dataset's responses (no policy samples) and trained;
    round 2 made candidates with the policy's samples and has not trained (no loss); a run not
    evaluated says so. An online training with a scalar judge shows its reward and best-of-k."""
    rounds = [
        {"candidates": {"mean_reward": 0.5, "best_of_k_reward": 0.75}, "train": {"first_loss": 2.0, "last_loss": 1.5}},
        {"candidates": {"mean_reward": 0.625, "best_of_k_reward": 0.875, "policy_sample_mean_reward": 0.25}},
    ]
    rep = {
        "kind": "rounds",
        "method": "rrhf",
        "rounds_finished": 1,
        "rounds_planned": 2,
        "final_policy": "pi_1",
        "rounds": [
            {"round": t, "train": None, "trained_on_train_prompts": None, **r} for t, r in enumerate(rounds, 1)
        ],
    }
    assert _summary(rep)[1:] == [
        "  round 1: candidates mean 0.500, best-of-k 0.750; loss 2.000 -> 1.500",
        "  round 2: candidates mean 0.625, best-of-k 0.875, policy samples 0.250",
        "  no held-out evaluation",
        "  report: out/report.md",
    ]
    from pofe.run.report import online_summary

    refreshes = [{"step": 0, "candidate_reward_mean": 0.5, "candidate_reward_best": 1.0}, {"step": 3}]
    refreshes[1] |= {"candidate_reward_mean": 0.75, "candidate_reward_best": 1.0}
    assert online_summary({"folder": "o", "refreshes": refreshes}) == [
        "  online: 2 refreshes, steps 0 -> 3: candidate reward 0.500 -> 0.750 (best-of-k 1.000 -> 1.000)"
    ]


def test_one_held_out_prompt_is_never_clear():
    """Issue 50: `pofe.eval.held_out: 1`, pi_1 scoring 2.5 above pi_0 on the one prompt, printed
    "use pi_1 ... +2.500 [+2.500, +2.500] over pi_0" and `clear: true`. Now there is no interval,
    the choice is not clear, and the console and the report say why: too few prompts."""
    from pofe.run.evaluation.decision import choose_model
    from pofe.run.evaluation.statistics import compare_iterates, reward_comparisons
    from pofe.run.report import held_out_summary
    from pofe.run.report.held_out import choice_section
    from pofe_candidates.win_rates import bradley_terry_preferences

    rewards = torch.tensor([[[0.0], [2.5]]], dtype=torch.float64)  # (P=1, M=2, S=1)
    ev = {
        **eval_record([[0.5, 0.076], [0.924, 0.5]]),
        "num_prompts": 1,
        "mean_reward": [0.0, 2.5],
        "kl_to_pi_0": [0.0, 0.5],
        **compare_iterates(bradley_terry_preferences(rewards.reshape(1, 2)), torch.ones(1, 2, 1)),
        **reward_comparisons(rewards),
    }
    ev = recorded(ev)
    choice = choose_model(ev)
    assert choice["clear"] is False
    why = "too few prompts (1) for an interval (at least 6: raise pofe.eval.held_out)"
    assert (choice["name"], choice["clear"], choice["diff_ci95"], choice["no_interval"]) == (
        "pi_1",
        False,
        [None, None],
        why,
    )
    assert held_out_summary({"eval": ev, "choice": choice})[1] == (
        f"  use pi_1 (best mean held-out reward 2.500, +2.500 over pi_0, not clearly: {why}; "
        "chosen by reward, the judge scores each answer)"
    )
    md = "\n".join(choice_section({"eval": ev, "choice": choice}))
    assert (
        f"**pi_1**: the highest mean reward on the held-out prompts (2.500), +2.500 over pi_0's, not clearly: {why}."
        in md
    )
    # an eval.json written before comparisons counted their prompts: its num_prompts decides
    old = {**ev, "reward_vs_pi_0": [None, {"diff": 2.5, "diff_ci95": [2.5, 2.5]}]}
    assert (choose_model(old)["clear"], choose_model(old)["no_interval"]) == (False, why)


def test_the_plots_never_draw_a_missing_verdict(tmp_path):
    """Issue 50: a held-out evaluation where the judge abstained on every answer (NaN rewards:
    an eval.json written before such a pass stopped the evaluation, or a judge2) gave NaN win
    rates, and the report crashed on matplotlib's "Axis limits cannot be NaN or Inf". The NaN
    values are left out of the plots; the win-rate heat map labels the pairs without a verdict
    "-"; the comparison against pi_0 has no win rate (None, not NaN)."""
    from pofe.run.evaluation.judging import mean_reward_per_model
    from pofe.run.evaluation.statistics import compare_iterates, reward_comparisons, win_matrix_from_rewards
    from pofe.run.report.plots import make_plots
    from pofe_candidates.win_rates import bradley_terry_preferences

    P, M = 8, 2
    rewards = torch.full((P, M, 1), float("nan"), dtype=torch.float64)
    ev = {
        **eval_record(win_matrix_from_rewards(rewards).tolist()),
        "mean_reward": mean_reward_per_model(rewards.tolist(), M),
        "mean_response_tokens": [3.0, 4.0],
        "mean_response_chars": [9.0, 12.0],
        "kl_to_pi_0": [0.0, 0.1],
        "perplexity": None,
        **compare_iterates(bradley_terry_preferences(rewards.reshape(P, M)), torch.ones(P, M, 1)),
        **reward_comparisons(rewards),
    }
    ev = recorded(ev)
    assert ev["mean_reward"] == [None, None] and ev["vs_pi_0"][1]["raw"] is None
    plots = make_plots({"eval": ev, "rounds": []}, tmp_path)
    assert plots == {"winrate": "report-winrate.png", "drift": "report-drift.png"}
    # a pi_1 with win rates but NaN where it has none: drawn without them
    ev["vs_pi_0"][1] = {"raw": 0.6, "raw_ci95": [float("nan"), 0.7], "lc": float("nan"), "lc_ci95": [None, None]}
    ev["mean_reward"] = [0.5, float("nan")]
    assert set(make_plots({"eval": ev, "rounds": []}, tmp_path)) == {"rewards", "lengths", "winrate", "drift"}
