"""`pofe.stop_when`: the decision on a constructed regression, its config rules, and the
runner ending a run after the round that fails (rounds and evaluation stubbed)."""

from __future__ import annotations

import json

import pytest
import yaml

from pofe.args import PofeConfig
from pofe.args.rounds import StopWhen
from pofe.run.evaluation.decision import choose_model, stop_decision
from pofe.run.evaluation.records import with_readings
from pofe.run.rounds import loop as rounds_module
from tests.helpers import ROOT, eval_fields, write_evaluation

RECIPE = ROOT / "recipes" / "tiny-rrhf-cpu.yml"
NAN = float("nan")


def versus(lc: float) -> dict:
    return {
        "raw": lc + 0.1,
        "raw_ci95": [lc, lc + 0.2],
        "lc": lc,
        "lc_ci95": [lc - 0.1, lc + 0.1],
        "length_slope": 0.0,
        "comparisons": 8,
        "prompts": 8,
    }


def evaluation(
    lc_vs_previous: list[float], rewards: list[float] | None, lc_vs_pi_0: list[float] | None = None
) -> dict:
    """eval.json's fields the decision and the choice read, for pi_0 .. pi_T."""
    T = len(lc_vs_previous)
    base = lc_vs_pi_0 or lc_vs_previous
    return {
        "models": [{"name": f"pi_{m}", "path": f"/m{m}"} for m in range(T + 1)],
        "vs_previous": [None] + [versus(x) for x in lc_vs_previous],
        "vs_pi_0": [None] + [versus(x) for x in base],
        "mean_reward": rewards,
    }


def test_a_round_below_the_threshold_stops():
    """pi_2 against pi_1 at equal length 0.30 < 0.45: stops after round 2, naming the rule and the
    value; pi_1 against pi_0 at 0.70 did not (a decision after round 1 reads pi_1 only)."""
    rule = StopWhen(lc_vs_previous_below=0.45)
    after_2 = stop_decision(evaluation([0.7, 0.3], None), rule)
    assert after_2["stop"] and after_2["round"] == 2 and after_2["unread"] == []
    (fired,) = after_2["fired"]
    assert fired["rule"] == "lc_vs_previous_below" and fired["value"] == 0.3 and fired["threshold"] == 0.45
    assert "pi_2" in fired["why"] and "pi_1" in fired["why"]
    assert stop_decision(evaluation([0.7], None), rule) == {"stop": False, "round": 1, "fired": [], "unread": []}
    # 0.45 is not below 0.45
    assert not stop_decision(evaluation([0.7, 0.45], None), rule)["stop"]


def test_a_falling_held_out_reward_stops_and_a_missing_one_says_why():
    """Rewards 0.50, 0.62, 0.61: round 2 fell by 0.01 (while its lc 0.55 passes 0.45); a NaN
    reward (abstentions) cannot be read: no stop, and the reason."""
    rule = StopWhen(held_out_reward_falls=True, lc_vs_previous_below=0.45)
    d = stop_decision(evaluation([0.7, 0.55], [0.50, 0.62, 0.61]), rule)
    assert d["stop"] and [f["rule"] for f in d["fired"]] == ["held_out_reward_falls"]
    assert d["fired"][0]["value"] == 0.61 and d["fired"][0]["previous"] == 0.62
    assert not stop_decision(evaluation([0.7, 0.55], [0.50, 0.62, 0.63]), rule)["stop"]
    nan = stop_decision(evaluation([0.7, 0.55], [0.50, NAN, 0.61]), rule)
    assert not nan["stop"] and nan["unread"] == ["no mean held-out reward of pi_2 and pi_1"]
    assert stop_decision(None, rule)["unread"] == ["no held-out evaluation of a trained model"]


def test_a_kl_ceiling_stops_and_the_choice_keeps_under_it():
    """KL to pi_0: pi_1 0.8, pi_2 2.5, ceiling 2.0. After round 1 nothing fires; after round 2 the
    ceiling does (2.5 > 2.0), naming the value. pi_2 has the best length-controlled win rate
    against pi_0 (0.80 over 0.70), but it is over the ceiling: the choice is pi_1, and says why."""
    rule = StopWhen(kl_to_pi_0_above=2.0)
    ev = {**evaluation([0.7, 0.6], None, lc_vs_pi_0=[0.7, 0.8]), "kl_to_pi_0": [0.0, 0.8, 2.5]}
    first = {**evaluation([0.7], None), "kl_to_pi_0": [0.0, 0.8]}
    assert not stop_decision(first, rule)["stop"]
    d = stop_decision(ev, rule)
    (fired,) = d["fired"]
    assert d["stop"] and fired["rule"] == "kl_to_pi_0_above" and fired["value"] == 2.5
    assert fired["why"] == "pi_2's KL to pi_0 is 2.500, above the ceiling 2.0"
    assert stop_decision({**ev, "kl_to_pi_0": [0.0, 0.8, NAN]}, rule)["unread"] == ["no KL to pi_0 of pi_2"]
    assert choose_model(ev)["name"] == "pi_2"  # no ceiling recorded: the best rate wins
    choice = choose_model({**ev, "kl_ceiling": 2.0})
    assert choice["name"] == "pi_1" and choice["over_kl_ceiling"] == ["pi_2"] and choice["kl_ceiling"] == 2.0
    # every iterate over it: pi_0 (KL 0) is the model to use
    assert choose_model({**ev, "kl_ceiling": 0.5})["name"] == "pi_0"


def test_pi_avg_is_chosen_like_an_iterate_and_never_decides_a_stop():
    """Models pi_0, pi_1, pi_2, pi_avg (eval.json's `average`: index 3). The stop rules read pi_2,
    the newest round's model, not pi_avg (whose KL 5.0 is over the ceiling and whose lc against
    pi_2 is 0.2); pi_avg has the best length-controlled rate against pi_0 (0.9) and is chosen
    when under the ceiling, and is no regression of a round."""
    ev = evaluation([0.7, 0.6, 0.2], [0.5, 0.6, 0.7, 0.4], lc_vs_pi_0=[0.7, 0.8, 0.9])
    ev["models"][3]["name"] = "pi_avg"
    ev.update(average={"index": 3, "of": ["pi_1", "pi_2"]}, kl_to_pi_0=[0.0, 0.5, 1.0, 5.0])
    rule = StopWhen(lc_vs_previous_below=0.5, held_out_reward_falls=True, kl_to_pi_0_above=2.0)
    d = stop_decision(ev, rule)
    assert d["round"] == 2 and not d["stop"] and d["unread"] == []
    assert choose_model(ev)["name"] == "pi_avg" and choose_model(ev)["regressions"] == []
    assert choose_model({**ev, "kl_ceiling": 2.0})["name"] == "pi_2"


def test_stop_when_config_rules():
    with pytest.raises(ValueError, match="sets no rule"):
        StopWhen()
    with pytest.raises(ValueError, match="kl_to_pi_0_above: 0.0 is out of range; set a finite number > 0.0"):
        StopWhen(kl_to_pi_0_above=0.0)
    with pytest.raises(ValueError, match="average_iterates shapes the held-out evaluation"):
        PofeConfig(method="sppo", rounds=3, eval={"held_out": 0, "average_iterates": True})
    with pytest.raises(
        ValueError, match="lc_vs_previous_below: 1.0 is out of range; set a finite number > 0.0 and < 1.0"
    ):
        StopWhen(lc_vs_previous_below=1.0)
    with pytest.raises(ValueError, match="turns off"):
        PofeConfig(method="sppo", rounds=3, eval={"held_out": 0}, stop_when={"lc_vs_previous_below": 0.5})
    with pytest.raises(ValueError, match="pairwise"):
        PofeConfig(
            method="sppo",
            rounds=3,
            stop_when={"held_out_reward_falls": True},
            generate={"backend": "transformers"},
            judge={"type": "python_pairwise", "function": "m:f"},
        )
    cfg = PofeConfig(method="sppo", rounds=3, stop_when={"lc_vs_previous_below": 0.5})
    assert cfg.stop_when.lc_vs_previous_below == 0.5


def stubbed_run(tmp_path, tiny_model, monkeypatch, stop_when: dict | None) -> tuple:
    """`run_rounds` on the tiny RRHF recipe at 3 rounds, each round's stages stubbed (its model a
    path) and the evaluation writing a constructed eval.json of the finished iterates: pi_1 beats
    pi_0 at equal length (0.70), pi_2 loses to pi_1 (0.30), pi_3 beats pi_2 (0.80). Returns
    (report.json, pofe-run.json, rounds trained, report.md, models evaluated each time, echoes)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(40)))
    raw = yaml.safe_load(RECIPE.read_text())
    raw.update(
        base_model=str(tiny_model), output_dir=str(tmp_path / "out"), dataset_prepared_path=str(tmp_path / "prepared")
    )
    raw["datasets"][0]["path"] = str(prompts)
    raw["pofe"].update(rounds=3, **({"stop_when": stop_when} if stop_when else {}))
    raw["pofe"].pop("eval", None)
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(yaml.safe_dump(raw))
    trained, evaluated = [], []

    def run_round(raw, folder, plan, runner):
        trained.append(plan.t)
        runner.state.round(plan.t).policy_out = f"/models/round-{plan.t}"
        runner.state.save()
        return f"/models/round-{plan.t}"

    def evaluate_rounds(recipe_path, folder, pcfg, runner):
        def work():
            T = len(runner.state.models(pcfg.rounds)) - 1
            evaluated.append(T)
            ev = evaluation([0.7, 0.3, 0.8][:T], None, lc_vs_pi_0=[0.7, 0.6, 0.75][:T])
            write_evaluation(folder, {**ev, **eval_fields(T + 1)})

        runner.run("eval", work, inputs={"models": runner.state.models(pcfg.rounds)})

    monkeypatch.setattr(rounds_module, "run_round", run_round)
    monkeypatch.setattr(rounds_module, "evaluate_rounds", evaluate_rounds)
    said: list[str] = []
    folder = rounds_module.run_rounds(recipe, echo=said.append)
    return (
        json.loads((folder.root / "report.json").read_text()),
        json.loads(folder.state.read_text()),
        trained,
        (folder.root / "report.md").read_text(),
        evaluated,
        said,
    )


def test_the_runner_stops_after_the_round_that_fails(tmp_path, tiny_model, monkeypatch):
    """lc_vs_previous_below 0.5: evaluated after round 1 (0.70, go on) and round 2 (0.30: stop);
    round 3 never trains; the report says why, and to use pi_1 (the best length-controlled
    rate against pi_0, 0.70 over pi_2's 0.60)."""
    rep, state, trained, md, evaluated, said = stubbed_run(
        tmp_path, tiny_model, monkeypatch, {"lc_vs_previous_below": 0.5}
    )
    assert trained == [1, 2] and evaluated == [1, 2]
    assert state["stopped"]["after_round"] == 2 and state["stages"]["round-2/stop-check"]["stop"]
    assert not state["stages"]["round-1/stop-check"]["stop"]
    assert rep["stopped"]["fired"][0]["value"] == 0.3 and rep["final_policy"] == "/models/round-2"
    assert rep["choice"]["name"] == "pi_1" and rep["choice"]["regressions"][0]["model"] == "pi_2"
    assert (
        "**Stopped after round 2 of 3** (`pofe.stop_when`): pi_2's length-controlled win rate against pi_1 "
        "is 0.300, below 0.5." in md
    )
    assert any(line.startswith("round 2: STOP (pofe.stop_when)") for line in said)


def test_without_a_rule_a_regression_only_warns(tmp_path, tiny_model, monkeypatch):
    """The same regression without `stop_when`: all 3 rounds train, one evaluation after the
    last; the report flags pi_2 and does not say the run stopped."""
    rep, state, trained, md, evaluated, _ = stubbed_run(tmp_path, tiny_model, monkeypatch, None)
    assert trained == [1, 2, 3] and evaluated == [3]
    assert state["stopped"] is None and rep["stopped"] is None
    assert "Stopped after" not in md and "pi_2 REGRESSED against pi_1" in md


def test_a_scalar_judge_chooses_by_reward():
    """Issue 44: with a scalar judge the choice reads the rewards, not Bradley-Terry win rates.
    Here pi_2 has the best length-controlled win rate (0.52, ties all round as Bradley-Terry over
    [0, 1] rewards makes them) but pi_1 the best mean reward, 0.60 against pi_0's 0.20 (+0.40,
    interval [0.30, 0.50]: clearly better); pi_2 fell to 0.50 against pi_1's 0.60 (-0.10, interval
    [-0.20, -0.01]: a clear regression). An eval.json without the reward comparisons (written
    before them) is still read by win rates."""

    def diff(d, lo, hi):
        return {"diff": d, "diff_ci95": [lo, hi]}

    ev = {
        **evaluation([0.51, 0.505], [0.2, 0.6, 0.5], lc_vs_pi_0=[0.51, 0.52]),
        "reward_ci95": [[0.1, 0.3], [0.5, 0.7], [0.4, 0.6]],
        "reward_vs_pi_0": [None, diff(0.4, 0.3, 0.5), diff(0.3, 0.2, 0.4)],
        "reward_vs_previous": [None, diff(0.4, 0.3, 0.5), diff(-0.1, -0.2, -0.01)],
    }
    choice = choose_model(ev)
    assert (choice["basis"], choice["name"], choice["mean_reward"], choice["clear"]) == ("reward", "pi_1", 0.6, True)
    assert choice["diff_vs_pi_0"] == 0.4 and choice["reward_ci95"] == [0.5, 0.7]
    assert [(r["model"], r["diff"], r["clear"]) for r in choice["regressions"]] == [("pi_2", -0.1, True)]
    by_win_rate = choose_model({k: v for k, v in ev.items() if not k.startswith("reward_")})
    assert (by_win_rate["basis"], by_win_rate["name"]) == ("win_rate", "pi_2")
    # no iterate above pi_0's reward: the base, not clearly anything
    worse = {**ev, "mean_reward": [0.7, 0.6, 0.5]}
    assert (choose_model(worse)["name"], choose_model(worse)["clear"]) == ("pi_0", False)


def test_eval_json_records_what_the_report_renders():
    """`with_readings` writes into eval.json what the report used to derive again: each judge's
    3-cycles at `cycle_threshold`, the largest distance of a win rate from 1/2 and the model to
    use, with the file's format. Worked by hand: pi_0 > pi_1 (0.6), pi_1 > pi_2 (0.7), pi_2 > pi_0
    (0.55) is the one cycle at 0.5 and none at 0.58 (0.55 is no longer a win); the farthest rate
    from 1/2 is 0.2 (0.7 and 0.3) for the first judge, 0.02 for the second; pi_2's length-controlled
    0.8 over pi_0 makes it the choice."""
    w = [[0.5, 0.6, 0.45], [0.4, 0.5, 0.7], [0.55, 0.3, 0.5]]
    w2 = [[0.5, 0.51, 0.49], [0.49, 0.5, 0.52], [0.51, 0.48, 0.5]]
    numbers = {**evaluation([0.6, 0.7], None, lc_vs_pi_0=[0.6, 0.8]), "win_matrix": w, "win_matrix_judge2": w2}
    ev = with_readings({**numbers, "cycle_threshold": 0.5})
    assert ev["format"] == 2 and ev["cycles"] == [(0, 1, 2)] and ev["cycles_judge2"] == [(0, 1, 2)]
    assert ev["win_matrix_spread"] == pytest.approx(0.2) and ev["win_matrix_spread_judge2"] == pytest.approx(0.02)
    assert ev["choice"] == choose_model(numbers) and ev["choice"]["name"] == "pi_2"
    strict = with_readings({**numbers, "cycle_threshold": 0.58, "win_matrix_judge2": None})
    assert strict["cycles"] == [] and strict["cycles_judge2"] is None and strict["win_matrix_spread_judge2"] is None
    # what the file holds and what the report reads back are the same (tuples become lists)
    assert json.loads(json.dumps(ev))["cycles"] == [[0, 1, 2]]
