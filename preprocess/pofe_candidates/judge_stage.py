"""The judge stage: every generated shard's candidates judged (`shard_work.judge_shard`), each
judge shard written atomically as it finishes and verified when a restart reads it back.

A judge that overlaps its calls across shards (an LLM judge's request window) judges two
shards side by side (`shards.judged_in_turn`); the stage stops (`abstentions`) as soon as the
judge gives too little signal, before a shard is written.
"""

from __future__ import annotations

from contextlib import closing
from functools import partial

from pofe.files import write_jsonl_atomic
from pofe_candidates.abstentions import AbstentionTally, check_abstentions
from pofe_candidates.judges import PairwiseJudge, ScalarJudge, make_judge
from pofe_candidates.shard_work import StagePlan, judge_shard
from pofe_candidates.shards import (
    check_judge_shard,
    judged_in_turn,
    progress_bar,
    read_shard,
    reuse_shard,
    shard_path,
)


def judge_stage(
    plan: StagePlan,
    generated: list[list[dict] | None],
    judge_impl: ScalarJudge | PairwiseJudge | None,
    redone: dict[str, int],
    final: bool,
) -> tuple[list[list[dict] | None], ScalarJudge | PairwiseJudge | None]:
    """The judge shards' rows for every generated shard (None elsewhere), writing the missing
    (or damaged) ones; and the judge used. Stops (abstentions.py) when the judge gives too
    little signal: over the limit on the shards seen so far, or (`final`: this process saw
    every shard) abstaining on everything."""
    cfg, judge_dir = plan.judge, plan.judge_dir
    mine = [s for s, g in enumerate(generated) if g is not None]
    shards: list[list[dict] | None] = [None] * len(generated)
    for s in mine:
        shards[s] = reuse_shard(judge_dir, s, partial(check_judge_shard, generated=generated[s]), redone)
    todo = [s for s in mine if shards[s] is None]
    if todo and judge_impl is None:
        judge_impl = make_judge(cfg)
    unit = "pairs" if cfg.is_pairwise else "candidates"
    check = dict(limit=cfg.max_abstention_rate, judge=cfg.function or cfg.type, unit=unit)
    tally = AbstentionTally().plus([r for shard in shards if shard is not None for r in shard])
    total = sum(len(generated[s]) for s in mine)

    def judge_one(s: int) -> list[dict]:
        # each row's other dataset columns: TRL-style reward functions take them as kwargs
        rows = [plan.rows[r["index"]] for r in generated[s]]
        columns = [{c: v for c, v in r.items() if c != plan.prompt_column} for r in rows]
        return judge_shard(generated[s], judge_impl, plan.target, cfg, columns)

    side_by_side = 2 if getattr(judge_impl, "overlaps_shards", False) else 1
    done = total - sum(len(generated[s]) for s in todo)
    # closing: a stop below cancels the shards not yet started now, not when the traceback goes
    with (
        progress_bar(plan.candidates.progress, total, "judge", done=done) as bar,
        closing(judged_in_turn(todo, judge_one, side_by_side)) as judged,
    ):
        for s, out_rows in judged:
            tally = tally.plus(out_rows)
            check_abstentions(tally, **check, final=False)  # before writing: a fixed judge redoes it
            write_jsonl_atomic(shard_path(judge_dir, s), out_rows)
            shards[s] = read_shard(shard_path(judge_dir, s))
            bar.update(len(generated[s]))
    if final:
        check_abstentions(tally, **check, final=True)
    return shards, judge_impl
