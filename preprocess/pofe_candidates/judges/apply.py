"""`apply_judge`: the one place a built judge is called, by the judge stage and by evaluation.

Each judge declares what it reads (`reads_rendered_prompt`, `reads_columns` in base.py);
here those flags pick its inputs, so that a judge sees the same thing in the pipeline and in
`axolotl pofe eval`.
"""

from __future__ import annotations

from pofe_candidates.judges.interface import (
    JudgeError,
    NotANumber,
    PairwiseJudge,
    PairwiseVerdict,
    ScalarJudge,
    Score,
    is_pairwise,
)
from pofe_candidates.render import Prompt


def apply_judge(
    judge: ScalarJudge | PairwiseJudge,
    prompts: list[Prompt],
    rendered: list[str | None],
    responses: list[list[str]],
    *,
    columns: list[dict] | None = None,
    rows: list[int | str] | None = None,
) -> list[list[Score]] | list[PairwiseVerdict]:
    """Judge P prompts' responses: `score` (P lists of K_p scores) for a scalar judge,
    `preferences` (P verdicts, one (K_p, K_p) matrix each) for a pairwise one.

    prompts: the dataset's prompts (strings or chat messages); rendered: the same prompts as
    the policy saw them (`render.render_prompt(...).text`, chat template applied). The judge
    gets `rendered` if it `reads_rendered_prompt`, else `prompts`. columns: each prompt's
    other dataset columns, passed only to judges that `reads_columns`. rows: each prompt's
    dataset row (or the caller's words for where it is: an online refresh names the file and row); a `JudgeError` (allow_abstain: false) or a `NotANumber` (a result that is no
    number) is re-raised naming it, as the judge itself knows only positions in this call. No prompts: no judge call.
    """
    for name, xs in (
        ("rendered prompts", rendered),
        ("response lists", responses),
        ("column dicts", columns),
        ("rows", rows),
    ):
        if xs is not None and len(xs) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(xs)} {name}")
    if not prompts:
        return []
    if judge.reads_rendered_prompt and any(text is None for text in rendered):
        raise ValueError(
            f"{type(judge).__name__} reads the chat-templated prompt, which these generate shards do not "
            "record (written by an older POFE): delete the candidates' generate/ folder to regenerate them"
        )
    extra = {"columns": columns} if judge.reads_columns and columns is not None else {}
    call = judge.preferences if is_pairwise(judge) else judge.score
    try:
        return call(rendered if judge.reads_rendered_prompt else prompts, responses, **extra)
    except (JudgeError, NotANumber) as e:
        if e.prompt is None or rows is None:
            raise
        raise e.at_row(rows[e.prompt]) from e
