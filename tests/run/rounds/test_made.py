"""What a finished stage made, in its end line on the console (`pofe.run.rounds.made`)."""

from __future__ import annotations

import json

from pofe.run.folder import RunFolder
from pofe.run.rounds.made import candidates_made, evaluation_made, training_made
from tests.helpers import eval_fields, write_evaluation, write_headline, write_summary


def test_candidates_made_rounds_what_the_summary_holds(tmp_path):
    """summary.json's full-precision means shown to 3 decimals; the win-rate spread when the
    method trains on win rates; samples cut at a user turn and abstentions only when there were some;
    paths in the run."""
    folder = RunFolder(tmp_path)
    summary = {
        "rows": 20,
        "candidates_per_prompt": {"mean": 4.95, "min": 4, "max": 5},
        "mean_candidate_reward": 0.1653228421638747,
        "mean_best_of_k_reward": 1.0,
        "mean_win_rate_spread": 0.25,
        "judge_abstentions": 0,
    }
    write_summary(folder, 1, **summary)
    assert candidates_made(folder, 1) == (
        "20 prompts x 5.0 candidates, mean reward 0.165, best-of-k 1.000, win-rate spread 0.250 "
        "(round-1/candidates/data.jsonl)"
    )
    pairwise = {**summary, "mean_candidate_reward": None, "judge_abstentions": 3, "candidates_cut_at_user_turn": 7}
    write_summary(folder, 1, **pairwise)
    assert candidates_made(folder, 1) == (
        "20 prompts x 5.0 candidates, win-rate spread 0.250, 7 samples cut where they began a user turn, "
        "3 judge abstentions (round-1/candidates/data.jsonl)"
    )


def test_training_made_counts_the_steps_run(tmp_path):
    """24 steps run, loss logged at 10 and 20: "24 steps", the first and last logged loss to 4
    significant digits, and the model's folder."""
    folder = RunFolder(tmp_path)
    state = folder.trainer_state(1)
    state.parent.mkdir(parents=True)
    history = [{"loss": 12.0317, "step": 10}, {"loss": 1.90714, "step": 20}, {"train_loss": 5.0, "step": 24}]
    state.write_text(json.dumps({"global_step": 24, "log_history": history}))
    assert training_made(folder, state, folder.train(1)) == "24 steps, loss 12.03 -> 1.907, model round-1/train"
    assert training_made(folder, None, folder.train(1)) == "model round-1/train"


def test_evaluation_made_names_its_models_and_prompts(tmp_path):
    folder = RunFolder(tmp_path)
    folder.eval_dir.mkdir()
    entry = {
        "model": "m",
        "num_prompts": 0,
        "model_mean_reward": None,
        "candidates_mean_reward": None,
        "candidates_best_of_k_reward": None,
        "policy_sample_mean_reward": None,
        "samples": [],
    }
    write_headline(folder, rounds={"1": entry, "2": entry})
    models = [{"name": f"pi_{m}", "path": f"/m{m}"} for m in range(3)]
    write_evaluation(
        folder,
        {**eval_fields(3), "models": models, "mean_reward": None, "vs_pi_0": [None] * 3, "vs_previous": [None] * 3},
    )
    assert evaluation_made(folder) == "headline of 2 round(s), 3 models on 8 held-out prompts (eval/)"
