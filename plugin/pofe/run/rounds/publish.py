"""Publishing an iterated run per round, as the SPPO authors publish theirs (`...-iter1`, `-iter2`).

Hub, when the recipe sets `hub_model_id: X` (or `pofe.hub_dataset_id: D`):
- round t's model goes to `X-iter<t>`. A full fine-tune's round recipe carries
  `hub_model_id: X-iter<t>` and axolotl's trainer pushes it. With LoRA / QLoRA the round
  recipe carries none (axolotl would push only the adapter): the runner pushes the merged
  iterate, the model the next round starts from, after the merge stage.
- round t's candidates (the judged k-response rows, `data.jsonl`, as `data/train.jsonl`,
  and the pipeline's `summary.json`) go to the dataset repo `D-iter<t>`, by default
  `X-iter<t>-data`.
Repos are created private, as axolotl creates its own (`hub_private_repo`).

Trackers: round t's training run is named `<name>-iter<t>` (`wandb_name`,
`trackio_run_name`) and, on W&B, grouped under `<name>` (`WANDB_RUN_GROUP`; axolotl 0.19
has no group key, and transformers passes trackio no group). `<name>` is the recipe's
`wandb_name` (or `trackio_run_name`), else the output_dir's folder name. After the report,
the round-level numbers (candidates' mean / best-of-k reward, held-out reward, KL, win
rates) go to one W&B run `<name>-rounds` of the same group, step = round (0 = pi_0).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pofe.files import stable_hash
from pofe.run.folder import RunFolder
from pofe.run.report.collect import sample_rows
from pofe.run.rounds.runner import StageRunner


def run_name(raw: dict) -> str:
    """The name the run's tracker runs and groups carry."""
    return str(raw.get("wandb_name") or raw.get("trackio_run_name") or Path(raw["output_dir"]).name)


def uses_wandb(raw: dict) -> bool:
    return bool(raw.get("wandb_project")) and raw.get("wandb_mode") != "disabled"


def tracker_keys(raw: dict, t: int) -> dict[str, str]:
    """The keys round t's recipe sets so its training run is named (and found) per round."""
    name, keys = run_name(raw), {}
    if uses_wandb(raw):
        keys["wandb_name"] = f"{name}-iter{t}"
        if raw.get("wandb_run_id"):  # one id for every round would resume round 1's run
            keys["wandb_run_id"] = f"{raw['wandb_run_id']}-iter{t}"
    if raw.get("trackio_project_name") or raw.get("use_trackio"):
        keys["trackio_run_name"] = f"{name}-iter{t}"
    return keys


def tracker_env(raw: dict) -> dict[str, str]:
    """Environment of the train stages: the W&B group every round's run joins."""
    return {"WANDB_RUN_GROUP": run_name(raw)} if uses_wandb(raw) else {}


def hub_model_repo(raw: dict, t: int) -> str | None:
    return f"{raw['hub_model_id']}-iter{t}" if raw.get("hub_model_id") else None


def hub_dataset_repo(raw: dict, t: int) -> str | None:
    dataset_id = (raw.get("pofe") or {}).get("hub_dataset_id")
    if dataset_id:
        return f"{dataset_id}-iter{t}"
    return f"{raw['hub_model_id']}-iter{t}-data" if raw.get("hub_model_id") else None


def push_model(api, repo_id: str, folder: Path, t: int) -> str:
    """Upload `folder` (round t's merged iterate) as the model repo `repo_id`; its commit url.
    `api`: a `huggingface_hub.HfApi` (its endpoint and token say where and as whom)."""
    api.create_repo(repo_id, repo_type="model", private=True, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        repo_type="model",
        commit_message=f"POFE round {t}: the merged iterate",
    )
    return str(commit.commit_url)


def push_candidates(api, repo_id: str, candidates_dir: Path, t: int) -> str:
    """Upload round t's judged candidates as the dataset repo `repo_id`; its commit url."""
    from huggingface_hub import CommitOperationAdd

    api.create_repo(repo_id, repo_type="dataset", private=True, exist_ok=True)
    operations = [
        # `data/train.jsonl` is what `load_dataset(repo_id)` reads as its train split
        CommitOperationAdd(path_in_repo="data/train.jsonl", path_or_fileobj=str(candidates_dir / "data.jsonl")),
        CommitOperationAdd(path_in_repo="pofe/summary.json", path_or_fileobj=str(candidates_dir / "summary.json")),
    ]
    commit = api.create_commit(
        repo_id,
        operations,
        repo_type="dataset",
        commit_message=f"POFE round {t}: judged candidates",
    )
    return str(commit.commit_url)


def _number(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def round_metrics(report: dict) -> list[tuple[int, dict[str, float]]]:
    """[(step, {metric: value})] from the report's numbers: step t holds round t's candidates
    and training, and the held-out numbers of pi_t (step 0: pi_0, the starting policy)."""
    by_step: dict[int, dict[str, float | None]] = {}
    for r in report["rounds"]:
        cands, train = r.get("candidates") or {}, r.get("train") or {}
        head = r.get("trained_on_train_prompts") or {}
        by_step[r["round"]] = {
            "headline/trained_reward": head.get("model_mean_reward"),
            "headline/best_of_k_reward": head.get("candidates_best_of_k_reward"),
            "candidates/mean_reward": cands.get("mean_reward"),
            "candidates/best_of_k_reward": cands.get("best_of_k_reward"),
            "candidates/policy_sample_mean_reward": cands.get("policy_sample_mean_reward"),
            "candidates/mean_best_win_rate": cands.get("mean_best_win_rate"),
            "candidates/win_rate_spread": cands.get("win_rate_spread"),
            "train/first_loss": train.get("first_loss"),
            "train/last_loss": train.get("last_loss"),
        }
    ev = report.get("eval")
    if ev:
        names = [m["name"] for m in ev["models"]]
        win, win2 = ev["win_matrix"], ev.get("win_matrix_judge2")
        for m, name in enumerate(names):
            step = int(name.removeprefix("pi_"))
            row = by_step.setdefault(step, {})
            for key in ("mean_reward", "mean_reward_judge2", "kl_to_pi_0", "perplexity", "mean_response_tokens"):
                values = ev.get(key)
                row[f"eval/{key}"] = values[m] if values else None
            if m > 0:  # against the starting policy and against the previous iterate
                row["eval/win_rate_vs_pi_0"] = win[m][0]
                row["eval/win_rate_vs_previous"] = win[m][m - 1]
                for key in ("vs_pi_0", "vs_previous"):  # length-controlled (`pofe.run.evaluation.statistics`)
                    row[f"eval/lc_win_rate_{key}"] = ((ev.get(key) or [None] * (m + 1))[m] or {}).get("lc")
                if win2:
                    row["eval/win_rate_vs_pi_0_judge2"] = win2[m][0]
        for b in ev.get("best_of_k") or []:  # round t's held-out candidates (`pofe.run.evaluation.best_of_k`)
            by_step.setdefault(b["round"], {})["eval/held_out_best_of_k_reward"] = b["best_of_k_reward"]
    out = []
    for step in sorted(by_step):
        kept = {k: v for k, v in ((k, _number(v)) for k, v in by_step[step].items()) if v is not None}
        if kept:
            out.append((step, kept))
    return out


def log_round_metrics(
    raw: dict, rows: list[tuple[int, dict[str, float]]], wandb_dir: Path, samples: list[dict] | None = None
) -> str:
    """Log `rows` to the W&B run `<name>-rounds` (group `<name>`) of the recipe's project, and
    `samples` (the report's sampled completions, `report.collect.sample_rows`) as the table
    `samples` at the last step; its id. The id follows the numbers, so a rerun with the same
    numbers reopens that run."""
    import wandb

    name = run_name(raw)
    run_id = f"{name}-rounds-{stable_hash(rows, 8)}"
    run = wandb.init(
        project=raw["wandb_project"],
        entity=raw.get("wandb_entity"),
        name=f"{name}-rounds",
        group=name,
        job_type="pofe-rounds",
        id=run_id,
        resume="allow",
        mode=raw.get("wandb_mode"),
        dir=str(wandb_dir),
        config={"method": (raw.get("pofe") or {}).get("method") or raw.get("rl")},
    )
    try:
        if samples:  # one table at the last step: W&B steps only go forward
            last, metrics = rows[-1] if rows else (0, {})
            table = wandb.Table(columns=list(samples[0]), data=[list(r.values()) for r in samples])
            rows = [*rows[:-1], (last, {**metrics, "samples": table})]
        for step, metrics in rows:
            run.log(metrics, step=step)
    finally:
        run.finish()
    return run_id


def push_round(raw: dict, folder: RunFolder, t: int, adapter: bool, runner: StageRunner) -> None:
    """Round t's push stage: its candidates and (`adapter`) its merged iterate to their hub
    repos, through `huggingface_hub.HfApi` as the environment configures it (`HF_TOKEN`,
    `HF_ENDPOINT`); a full fine-tune's model axolotl's trainer pushed already."""
    model_repo = hub_model_repo(raw, t) if adapter else None
    data_repo = hub_dataset_repo(raw, t)
    if not (model_repo or data_repo):
        return

    def work() -> dict:
        from huggingface_hub import HfApi

        hub = HfApi()
        pushed = {}
        if data_repo:
            runner.echo(f"round {t}: push the candidates to the dataset repo {data_repo}")
            pushed["dataset"] = [data_repo, push_candidates(hub, data_repo, folder.candidates(t), t)]
        if model_repo:
            runner.echo(f"round {t}: push the merged iterate to {model_repo}")
            pushed["model"] = [model_repo, push_model(hub, model_repo, folder.merged(t), t)]
        return pushed

    runner.run(f"round-{t}/push", work)


def log_rounds(raw: dict, report: dict, folder: RunFolder, runner: StageRunner) -> None:
    """The tracker stage: the report's round-level numbers to W&B (`log_round_metrics`), once
    per set of numbers."""
    rows = round_metrics(report)

    def work() -> dict:
        run_id = log_round_metrics(raw, rows, folder.root, sample_rows(report))
        runner.echo(f"round-level numbers logged to W&B run {run_id} (project {raw['wandb_project']})")
        return {"run_id": run_id}

    runner.run("tracker", work, inputs={"rows_hash": stable_hash(rows)})
