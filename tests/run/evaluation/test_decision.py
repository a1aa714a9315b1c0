"""`pofe.stop_when`: the decision on a constructed regression, its config rules, and the
runner ending a run after the round that fails (rounds and evaluation stubbed)."""

from __future__ import annotations

import json

import pytest
import yaml

from pofe.args import PofeConfig
from pofe.args.rounds import StopWhen
from pofe.run.evaluation.decision import stop_decision
from pofe.run.rounds import loop as rounds_module
from tests.helpers import ROOT

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


def test_stop_when_config_rules():
    with pytest.raises(ValueError, match="sets no rule"):
        StopWhen()
    with pytest.raises(ValueError, match="less than 1"):
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


def report_fields(M: int) -> dict:
    """The rest of an eval.json of M models that the report reads (values of no interest here)."""
    per_model = [1.0] * M
    return {
        "num_prompts": 4,
        "prompts_source": "held-out",
        "judge": {"type": "python", "function": "m:f"},
        "judge2": None,
        "decoding": {"num_samples": 1, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4, "seed": 0},
        "win_matrix_method": "bradley_terry",
        "win_matrix": [[0.5] * M] * M,
        "win_matrix_judge2": None,
        "win_matrix_ci95": [[[0.4, 0.6]] * M] * M,
        "mean_reward_judge2": None,
        "mean_response_tokens": per_model,
        "mean_response_chars": per_model,
        "kl_to_base": per_model,
        "perplexity": None,
        "reference_count": 0,
        "response_tokens": {"mean": per_model, "median": per_model},
        "cycle_threshold": 0.5,
    }


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
            folder.eval_dir.mkdir(parents=True, exist_ok=True)
            (folder.eval_dir / "eval.json").write_text(json.dumps({**ev, **report_fields(T + 1)}))

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
