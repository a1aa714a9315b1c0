"""Evaluation's judging: the recipe's judges (built once per evaluation) on the models' answers.

Every call goes through `pofe_candidates.judges.apply_judge`, as the judge stage's do: a judge
that reads the rendered prompt (PairRM) gets the chat-templated text the models sampled from,
one that reads dataset columns (TRL-style reward functions) gets them, and the rest get the
dataset's prompt, exactly as when the round's candidates were judged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pofe.run.evaluation.statistics import block_win_matrix, win_matrix_from_rewards
from pofe_candidates.judges import Abstain, JudgeError, PairwiseJudge, ScalarJudge, apply_judge, is_pairwise
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
) -> list:
    """`apply_judge` on P prompts, `JUDGE_CHUNK` at a time under a progress bar (`desc`); each
    prompt is judged on its own, so the chunks change no verdict. A missing verdict's error names
    the prompt's dataset row from `rows`, else its position among the P prompts."""
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
    return out


def scalar_scores(
    judge: ScalarJudge,
    prompts: list,
    rendered: list[str],
    responses: list[list[str]],
    columns: list[dict] | None = None,
    rows: list[int] | None = None,
    desc: str = "judge",
) -> list[list[float]]:
    """P prompts' scores, NaN for abstentions. `rendered`: the prompts as the models saw them;
    `columns`: each prompt's other dataset columns; `rows`: each prompt's dataset row, named
    by a missing verdict's error (see `apply_judge`); `desc`: the pass's progress bar."""
    scores = judge_pass(judge, prompts, rendered, responses, desc, columns=columns, rows=rows)
    return [[math.nan if isinstance(v, Abstain) else float(v) for v in row] for row in scores]


def pairwise_preferences(
    judge: PairwiseJudge,
    prompts: list,
    rendered: list[str],
    responses: list[list[str]],
    desc: str = "judge",
    columns: list[dict] | None = None,
) -> Tensor:
    """(P, N, N) preference matrices of a pairwise judge, N responses per prompt."""
    verdicts = judge_pass(judge, prompts, rendered, responses, desc, columns=columns)
    return torch.stack([v.matrix.to(torch.float64) for v in verdicts])  # (P, N, N)


def judge_models(
    judge: ScalarJudge | PairwiseJudge,
    prompts: list,
    rendered: list[str],
    texts: list[list[list[str]]],
    desc: str = "judge the held-out answers",
    columns: list[dict] | None = None,
) -> dict:
    """texts[p][m][s] -> {"rewards": (P, M, S) list or None, "win_matrix": (M, M), "method",
    "pref": the (P, M*S, M*S) response preferences behind the matrix (a tensor, not for JSON)}.
    Scalar judges' preferences are Bradley-Terry's, sigmoid(r_i - r_j). `columns`: each prompt's
    other dataset columns, for judges that read them."""
    P, M, S = len(texts), len(texts[0]), len(texts[0][0])
    flat = [[t for m in range(M) for t in texts[p][m]] for p in range(P)]  # (P, M*S), model-major
    if is_pairwise(judge):
        pref = pairwise_preferences(judge, prompts, rendered, flat, desc, columns)
        return {
            "rewards": None,
            "win_matrix": block_win_matrix(pref, M, S).tolist(),
            "method": "pairwise",
            "pref": pref,
        }
    scores = torch.tensor(scalar_scores(judge, prompts, rendered, flat, columns, desc=desc), dtype=torch.float64)
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
