"""What a finished stage of `axolotl pofe run` made, in a few words for its end line on the
console (`pofe.run.rounds.runner.StageRunner.run`), read from the files it wrote; paths relative to
the run's folder, which the run names as it starts."""

from __future__ import annotations

import json
from pathlib import Path

from pofe.records.candidates import CandidatesSummary
from pofe.records.evaluation import EvalRecord
from pofe.records.headline import Headline
from pofe.run.folder import REWRITE_EVAL, RunFolder
from pofe.run.report.cells import fmt
from pofe.run.rounds.runner import shown_path


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def candidates_made(folder: RunFolder, t: int) -> str:
    """The preprocess stage: prompts, candidates per prompt, their labels, the samples cut where they
    began a user turn and the judge's abstentions (when there are any), where they are."""
    candidates = folder.candidates(t)
    summary = CandidatesSummary.read_if_written(folder.summary(t), folder.rewrite_summary(t))
    if summary is None:
        return shown_path(candidates, folder.root)
    parts = [f"{summary.rows} prompts x {fmt(summary.candidates_per_prompt.mean, 1)} candidates"]
    if summary.mean_candidate_reward is not None:
        parts.append(
            f"mean reward {fmt(summary.mean_candidate_reward)}, best-of-k {fmt(summary.mean_best_of_k_reward)}"
        )
    if summary.mean_win_rate_spread is not None:
        parts.append(f"win-rate spread {fmt(summary.mean_win_rate_spread)}")
    if summary.candidates_cut_at_user_turn:
        parts.append(f"{summary.candidates_cut_at_user_turn} samples cut where they began a user turn")
    if summary.judge_abstentions:
        parts.append(f"{summary.judge_abstentions} judge abstentions")
    return ", ".join(parts) + f" ({shown_path(candidates / 'data.jsonl', folder.root)})"


def training_made(folder: RunFolder, trainer_state: Path | None, model: Path) -> str:
    """The train stage: steps run, the loss's first and last logged values, the model."""
    state = _read(trainer_state) if trainer_state else None
    where = f"model {shown_path(model, folder.root)}"
    if state is None:
        return where
    losses = [h["loss"] for h in state.get("log_history", []) if "loss" in h]
    loss = f", loss {losses[0]:.4g} -> {losses[-1]:.4g}" if losses else ""
    steps = state["global_step"]
    return f"{steps} step{'' if steps == 1 else 's'}{loss}, {where}"


def evaluation_made(folder: RunFolder) -> str:
    """The eval stage: the rounds of its headline, the models answered on how many prompts."""
    held_out = EvalRecord.read_if_written(folder.evaluation, REWRITE_EVAL)
    headline = Headline.read_if_written(folder.headline, REWRITE_EVAL)
    parts = []
    if headline and headline.rounds:
        parts.append(f"headline of {len(headline.rounds)} round(s)")
    if held_out:
        parts.append(f"{len(held_out.models)} models on {held_out.num_prompts} held-out prompts")
    return ", ".join(parts) + f" ({shown_path(folder.eval_dir, folder.root)}/)"
