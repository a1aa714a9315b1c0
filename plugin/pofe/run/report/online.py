"""The report of an online training (`pofe.online`): each refresh's candidate reward and KL to pi_0.

An online recipe is trained by one `axolotl train` and evaluated as a trained model against
its base (`pofe.run.evaluation.trained`); its refreshes stay where the training wrote them,
under the trained model's folder (`<output_dir>/online/refresh-<step>/refresh.json`, read by
`pofe.records.refresh.written_refreshes`). The report shows their stats as a table and a plot,
and digests their files in the training's reproducibility record (`pofe.run.provenance`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pofe.args.online import OnlineConfig
from pofe.records.refresh import FOLDER, written_refreshes
from pofe.run.folder import CHECKPOINT, RunFolder, RunState
from pofe.run.provenance import online_record
from pofe.run.report.cells import fmt, table

# refresh.json's stats in the report's table: (key, column, decimals)
COLUMNS = (
    ("prompts", "prompts", 0),
    ("candidates", "candidates", 0),
    ("candidate_reward_mean", "candidate reward (mean)", 3),
    ("candidate_reward_best", "best-of-k", 3),
    ("kl_to_pi_0", "KL to pi_0", 3),
)


def online_training(folder: RunFolder, state: RunState) -> tuple[dict | None, dict | None]:
    """(report.json's `online`, the training's reproducibility record): both None unless
    `folder` is a trained model's evaluation whose recipe sets `pofe.online`."""
    recipe = folder.recipe(1)
    if state.kind != "trained" or not recipe.exists():
        return None, None
    block = (yaml.safe_load(recipe.read_text()) or {}).get("pofe") or {}
    if block.get("online") is None:
        return None, None
    settings = OnlineConfig.model_validate(block["online"])
    output_dir = Path(state.round(1).policy_out)
    refreshes = written_refreshes(output_dir)
    checkpoint = CHECKPOINT.fullmatch(output_dir.name)
    if checkpoint and not refreshes:
        # a checkpoint of the training, evaluated on its own: its refreshes are its output_dir's,
        # those whose first step it trained
        output_dir = output_dir.parent
        refreshes = [r for r in written_refreshes(output_dir) if r.start_step < int(checkpoint.group(1))]
    part = {
        "folder": str(output_dir / FOLDER),
        "refresh_every": settings.refresh_every,
        "kl_coef": settings.kl_coef,
        # step: the optimizer steps the policy had taken when it sampled the refresh
        "refreshes": [{"step": r.start_step, **r.stats} for r in refreshes],
    }
    return part, online_record(folder, state, refreshes)


def online_section(online: dict | None, plots: dict[str, str]) -> list[str]:
    """## Online training: one row per refresh, and its plot."""
    if online is None:
        return []
    md = ["## Online training", ""]
    refreshes = online["refreshes"]
    if not refreshes:
        return md + [
            f"No finished refresh under `{online['folder']}` (no refresh-*/refresh.json): the trained model was "
            "not trained online there.",
            "",
        ]
    md += [
        f"`axolotl train` sampled, judged and trained on candidates from the policy as it trained: "
        f"{len(refreshes)} refreshes, every {online['refresh_every']} optimizer steps or at an epoch's end "
        f"(`pofe.online`, kl_coef {online['kl_coef']}), each read from its `refresh.json` under "
        f"`{online['folder']}`. step: the optimizer steps the policy had taken when it sampled the refresh "
        "(its candidates train the steps from there). Candidate reward: the judge's reward of the policy's own "
        "samples (dataset responses left out), their mean and best-of-k (the mean over prompts of each prompt's "
        "best). KL to pi_0: the mean over the candidates trained on of log pi(y|x) - log pi_0(y|x), measured "
        "only with kl_coef above 0. `-`: not measured.",
        "",
    ]
    if "online" in plots:
        md += [f"![candidate reward and KL to pi_0 per refresh]({plots['online']})", ""]
    rows = [
        [str(n), str(r["step"]), *(fmt(r.get(key), digits) for key, _, digits in COLUMNS)]
        for n, r in enumerate(refreshes, 1)
    ]
    return md + [table(["refresh", "step", *(column for _, column, _ in COLUMNS)], rows), ""]
