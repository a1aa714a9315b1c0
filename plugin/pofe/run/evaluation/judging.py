"""Evaluation's judging: the recipe's judges (built once per evaluation) on the models' answers.

Every call goes through `pofe_candidates.judges.apply_judge`, as the judge stage's do: a judge
that reads the rendered prompt (PairRM) gets the chat-templated text the models sampled from,
one that reads dataset columns (TRL-style reward functions) gets them, and the rest get the
dataset's prompt, exactly as when the round's candidates were judged.

Abstentions (a verdict the judge could not give: NaN rewards, pairs without a preference) are
counted per pass, and a pass stops the evaluation as the judge stage stops a run
(`pofe_candidates.abstentions`): when the judge abstained on more than its
`max_abstention_rate` of the pass's verdicts, or on every one. Below that, means are over the
answers with a reward, and eval.json counts both (`reward_count`, `abstained`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pofe.run.evaluation.statistics import block_win_matrix, win_matrix_from_rewards
from pofe_candidates.abstentions import AbstentionTally, check_abstentions
from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges import (
    Abstain,
    JudgeError,
    PairwiseJudge,
    PairwiseVerdict,
    ScalarJudge,
    apply_judge,
    is_pairwise,
)
from pofe_candidates.shards import progress_bar
from pofe_candidates.win_rates import bradley_terry_preferences, nan_mean

# prompts per `apply_judge` call: a judge pass's progress bar moves this many at a time
JUDGE_CHUNK = 16


def judge_pass(
    judge: ScalarJudge | PairwiseJudge,
    prompts: list,
    rendered: list[str],
    responses: list[list[str]],
    desc: str,
    columns: list[dict] | None = None,
    rows: list[int] | None = None,
    cfg: JudgeConfig | None = None,
    setting: str = "pofe.judge",
) -> list:
    """`apply_judge` on P prompts, `JUDGE_CHUNK` at a time under a progress bar (`desc`); each
    prompt is judged on its own, so the chunks change no verdict. A missing verdict's error names
    the prompt's dataset row from `rows`, else its position among the P prompts. With the judge's
    `cfg` (`setting`: where the recipe sets it), the pass's abstentions are checked against its
    `max_abstention_rate` (`check_verdicts`)."""
    out: list = []
    with progress_bar(True, len(prompts), f"eval {desc}") as bar:
        for start in range(0, len(prompts), JUDGE_CHUNK):
            part = slice(start, start + JUDGE_CHUNK)
            try:
                out += apply_judge(
                    judge,
                    prompts[part],
                    rendered[part],
                    responses[part],
                    columns=columns[part] if columns is not None else None,
                    rows=rows[part] if rows is not None else None,
                )
            except JudgeError as e:
                if rows is not None or e.prompt is None:
                    raise
                raise JudgeError(e.reason, e.where, prompt=start + e.prompt) from e
            bar.update(len(prompts[part]))
    if cfg is not None:
        check_verdicts(out, cfg, setting, desc, rows)
    return out


def check_verdicts(
    verdicts: list, cfg: JudgeConfig, setting: str, desc: str, rows: list[int] | None = None
) -> AbstentionTally:
    """A judge pass's abstentions (scalar: answers without a score; pairwise: pairs of answers
    without a preference), tallied; raises `NoJudgeSignal` naming the judge, the count, the
    commonest reason with its prompt (dataset row from `rows`, else its position) and
    `setting`'s max_abstention_rate when they are over that limit, or are every verdict."""
    judged = []
    for p, v in enumerate(verdicts):
        where = f"{desc}, " + (f"dataset row {rows[p]}" if rows is not None else f"prompt {p}")
        if isinstance(v, PairwiseVerdict):
            k = len(v.matrix)
            judged.append(
                {
                    "where": where,
                    "judged": k * (k - 1) // 2,
                    "abstained": v.abstained_pairs,
                    "abstain_reasons": v.abstain_reasons,
                }
            )
        else:
            reasons = [x.reason for x in v if isinstance(x, Abstain)]
            judged.append({"where": where, "judged": len(v), "abstained": len(reasons), "abstain_reasons": reasons})
    tally = AbstentionTally().plus(judged)
    check_abstentions(
        tally,
        limit=cfg.max_abstention_rate,
        judge=cfg.function or cfg.type,
        unit="pairs of answers" if cfg.is_pairwise else "answers",
        final=True,
        setting=setting,
        redo="the answers stored in eval/answers are judged again, not sampled again",
    )
    return tally


def scalar_scores(
    judge: ScalarJudge,
    prompts: list,
    rendered: list[str],
    responses: list[list[str]],
    columns: list[dict] | None = None,
    rows: list[int] | None = None,
    desc: str = "judge",
    cfg: JudgeConfig | None = None,
    setting: str = "pofe.judge",
) -> list[list[float]]:
    """P prompts' scores, NaN for abstentions. `rendered`: the prompts as the models saw them;
    `columns`: each prompt's other dataset columns; `rows`: each prompt's dataset row, named
    by a missing verdict's error (see `apply_judge`); `desc`: the pass's progress bar; `cfg`,
    `setting`: the judge's config, its abstentions checked (`judge_pass`)."""
    scores = judge_pass(
        judge, prompts, rendered, responses, desc, columns=columns, rows=rows, cfg=cfg, setting=setting
    )
    return [[math.nan if isinstance(v, Abstain) else float(v) for v in row] for row in scores]


def pairwise_preferences(
    judge: PairwiseJudge,
    prompts: list,
    rendered: list[str],
    responses: list[list[str]],
    desc: str = "judge",
    columns: list[dict] | None = None,
    cfg: JudgeConfig | None = None,
    setting: str = "pofe.judge",
) -> Tensor:
    """(P, N, N) preference matrices of a pairwise judge, N responses per prompt (`cfg`,
    `setting`: as `judge_pass`)."""
    verdicts = judge_pass(judge, prompts, rendered, responses, desc, columns=columns, cfg=cfg, setting=setting)
    return torch.stack([v.matrix.to(torch.float64) for v in verdicts])  # (P, N, N)


def judge_models(
    judge: ScalarJudge | PairwiseJudge,
    prompts: list,
    rendered: list[str],
    texts: list[list[list[str]]],
    desc: str = "judge the held-out answers",
    columns: list[dict] | None = None,
    cfg: JudgeConfig | None = None,
    setting: str = "pofe.judge",
) -> dict:
    """texts[p][m][s] -> {"rewards": (P, M, S) list or None, "win_matrix": (M, M), "method",
    "pref": the (P, M*S, M*S) response preferences behind the matrix (a tensor, not for JSON)}.
    Scalar judges' preferences are Bradley-Terry's, sigmoid(r_i - r_j). `columns`: each prompt's
    other dataset columns, for judges that read them; `cfg`, `setting`: the judge's config, its
    abstentions checked (`judge_pass`)."""
    P, M, S = len(texts), len(texts[0]), len(texts[0][0])
    flat = [[t for m in range(M) for t in texts[p][m]] for p in range(P)]  # (P, M*S), model-major
    if is_pairwise(judge):
        pref = pairwise_preferences(judge, prompts, rendered, flat, desc, columns, cfg, setting)
        return {
            "rewards": None,
            "win_matrix": block_win_matrix(pref, M, S).tolist(),
            "method": "pairwise",
            "pref": pref,
        }
    scores = scalar_scores(judge, prompts, rendered, flat, columns, desc=desc, cfg=cfg, setting=setting)
    scores = torch.tensor(scores, dtype=torch.float64)
    scores = scores.reshape(P, M, S)
    return {
        "rewards": scores.tolist(),
        "win_matrix": win_matrix_from_rewards(scores).tolist(),
        "method": "bradley_terry",
        "pref": bradley_terry_preferences(scores.reshape(P, M * S)),
    }


def mean_reward_per_model(rewards: list | None, num_models: int) -> list[float | None] | None:
    """rewards (P, M, S) -> each model's mean over prompts and samples (NaN left out)."""
    if rewards is None:
        return None
    return [nan_mean([x for per_prompt in rewards for x in per_prompt[m]]) for m in range(num_models)]


def reward_counts(rewards: list | None, num_models: int) -> dict:
    """rewards (P, M, S) -> {"reward_count": each model's answers with a reward (its mean's),
    "abstained": each model's answers without one (NaN)}; both None without rewards."""
    if rewards is None:
        return {"reward_count": None, "abstained": None}
    answers = [[x for per_prompt in rewards for x in per_prompt[m]] for m in range(num_models)]
    abstained = [sum(math.isnan(x) for x in a) for a in answers]
    return {"reward_count": [len(a) - n for a, n in zip(answers, abstained)], "abstained": abstained}
