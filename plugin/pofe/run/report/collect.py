"""The run's numbers, collected from its own files into one JSON-able dict.

Sources: the state file (stages, policies), each round's candidates/summary.json (rewards,
lengths, saturation: `pofe.records.candidates`), each round's trainer_state.json (loss curves)
and length-policy record (`truncation`), each round's reproducibility record
(`pofe.run.provenance`), and eval/headline.json (`pofe.records.headline`) and eval/eval.json
(`axolotl pofe eval`); for an online training, its refreshes (`online`). A part without data is
None. `sample_rows` gives the headline's sampled completions as plain rows (for the report's
tables and for trackers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pofe.files import read_jsonl
from pofe.methods import method_spec
from pofe.records.candidates import CandidatesSummary
from pofe.records.evaluation import EvalRecord
from pofe.records.headline import Headline
from pofe.run.folder import REWRITE_EVAL, RunFolder, RunState
from pofe.run.guards import pofe_wrote
from pofe.run.provenance import round_record
from pofe.run.report.online import online_training
from pofe.run.report.truncation import round_truncation
from pofe.training_log import logged_curves


def training_stats(trainer_state: Path, method: str) -> dict | None:
    """Steps run, and the loss and the method's diagnostic (first, last, curves) from a
    trainer_state.json; a run shorter than `logging_steps` logged none (first and last None,
    no curves)."""
    if not trainer_state.exists():
        return None
    state = json.loads(trainer_state.read_text())
    steps = [h for h in state["log_history"] if "loss" in h and "step" in h]
    spec = method_spec(method)
    key = spec.diagnostic_metric
    curves = logged_curves(steps, ("loss", key, *spec.report_curves))
    diagnostic = curves.get(key, [])
    return {
        "steps": state["global_step"],  # steps run; the last logged one is a multiple of logging_steps
        "max_steps": state.get("max_steps"),  # steps planned: more than `steps` in a checkpoint's, or a stopped run's
        "logging_steps": state.get("logging_steps"),
        "first_loss": steps[0]["loss"] if steps else None,
        "last_loss": steps[-1]["loss"] if steps else None,
        "diagnostic": key,
        "diagnostic_first": diagnostic[0][1] if diagnostic else None,
        "diagnostic_last": diagnostic[-1][1] if diagnostic else None,
        "curves": curves,
    }


def round_stats(folder: RunFolder, state: RunState, t: int, headline: Headline | None) -> dict:
    """One round's row of the report."""
    info = state.round(t)
    prompts = folder.round_prompts(t)
    record: dict[str, Any] = {
        "round": t,
        "policy_in": info.policy_in,
        "policy_out": info.policy_out,
        "generate_seed": info.generate_seed,
        "prompts": len(read_jsonl(prompts)) if prompts.exists() else None,
        "stage_seconds": {
            name.split("/")[1]: stage.get("seconds")
            for name, stage in state.stages.items()
            if name.startswith(f"round-{t}/") and stage.get("status") == "done"
        },
        "candidates": None,
        "train": training_stats(folder.trainer_state(t), state.method),
        "lengths": None,
        "truncation": round_truncation(folder.prepared(t)),
        "trained_on_train_prompts": None,
        "reproduce": round_record(folder, state, t),
    }
    summary = CandidatesSummary.read_if_written(folder.summary(t), folder.rewrite_summary(t))
    if summary is not None:
        record["candidates"] = {
            "rows": summary.rows,
            "per_prompt": summary.candidates_per_prompt.mean,
            "mean_reward": summary.mean_candidate_reward,
            "best_of_k_reward": summary.mean_best_of_k_reward,
            "policy_sample_mean_reward": summary.mean_policy_sample_reward,
            "mean_tokens": summary.mean_candidate_tokens,
            "mean_best_win_rate": summary.mean_best_win_rate,
            "win_rate_spread": summary.mean_win_rate_spread,
            "saturation": summary.saturation and summary.saturation.model_dump(),
            "saturation_warning": summary.saturation and summary.saturation.warning(f"Round {t}"),
            "judge_abstentions": summary.judge_abstentions,
        }
        record["lengths"] = summary.lengths and summary.lengths.model_dump()
    if headline and str(t) in headline.rounds:
        record["trained_on_train_prompts"] = headline.rounds[str(t)].model_dump(mode="json")
    return record


def collect(folder: RunFolder) -> dict:
    """Everything the report shows, as one JSON-able dict."""
    if not folder.state.exists():
        raise ValueError(f"no run state at {folder.state}: nothing to report")
    state = RunState.read(folder.state)
    # not an eval.json that was there before the run (pofe.overwrite_output_dir)
    evaluation = (
        EvalRecord.read(folder.evaluation, REWRITE_EVAL).model_dump(mode="json")
        if folder.evaluation.exists() and pofe_wrote(folder, folder.evaluation)
        else None
    )
    headline = Headline.read_if_written(folder.headline, REWRITE_EVAL)
    rounds = [round_stats(folder, state, int(key), headline) for key in sorted(state.rounds, key=int)]
    online, record = online_training(folder, state)
    if record:  # the one training's record: its refreshes' files, not a candidates folder
        rounds[0]["reproduce"] = record
    report: dict[str, Any] = {
        "output_dir": str(folder.root),
        # "rounds": an iterated run; "trained": one trained model against its base (pofe.run.evaluation.trained)
        "kind": state.kind,
        "method": state.method,
        "rounds_planned": state.rounds_planned,
        "rounds_finished": sum(1 for r in rounds if r["policy_out"]),
        "final_policy": state.final_policy,
        "starts": len(state.starts),
        # axolotl's command-line options the run (or evaluation) was started with
        "overrides": state.overrides,
        # the run ended after this round by `pofe.stop_when` (`pofe.run.evaluation.decision`); None: it did not
        "stopped": state.stopped,
        "rounds": rounds,
        # how the headline was drawn, or why there is none; None: `axolotl pofe eval` has not run
        "headline": headline.model_dump(mode="json", exclude={"rounds"}) if headline else None,
        "eval": None,
        # an online training's refreshes (`pofe.run.report.online`); None: not an online training
        "online": online,
    }
    report["eval"] = evaluation
    # finished models the held-out evaluation lacks (it ran before they finished): no choice
    # is named from an evaluation that has not seen every candidate for it
    evaluated = {m["name"] for m in evaluation["models"]} if evaluation else set()
    report["eval_missing"] = [n for n, _ in state.models()[1:] if n not in evaluated] if evaluation else []
    report["choice"] = None if report["eval_missing"] or not evaluation else evaluation["choice"]
    return report


def sample_rows(report: dict) -> list[dict]:
    """The headline's sampled completions of every round, as plain rows: round, index (of the
    prompt in the round's candidates), sample, prompt, completion, reward, best_candidate,
    best_candidate_reward."""
    return [
        {"round": r["round"], **row}
        for r in report["rounds"]
        for row in (r.get("trained_on_train_prompts") or {}).get("samples", [])
    ]
