"""The generate stage: the missing shards' prompts to the backend as one stream, each shard
written atomically the moment its last prompt finishes (generators/stream.py).

Shards are rendered lazily, as the backend's window takes them; a shard that finishes is
written (pofe.files) and read back before the next is counted done, so a kill at any point
leaves only whole shards, and a resume renders and requests only the missing ones. Seeds are
per shard (`seed + shard * SHARD_SEED_STRIDE`) and per prompt within it, so what a shard holds
does not depend on which other shards were in the engine with it.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from pathlib import Path

from pofe.files import write_jsonl_atomic
from pofe_candidates.generators import Generator, make_generator
from pofe_candidates.generators.stream import ShardJob, stream_shards
from pofe_candidates.models import load_tokenizer
from pofe_candidates.shard_work import StagePlan, close_generator, render_shard, shard_rows
from pofe_candidates.shards import check_generate_shard, progress_bar, read_shard, reuse_shard, shard_path

SHARD_SEED_STRIDE = 1_000_003  # > any shard size: per-prompt seeds never collide across shards


def generate_missing(
    plan: StagePlan, todo: list[int], shards: list, generator: Generator | None, tokenizer, workdir: Path, bar
) -> Generator | None:
    """Generate shards `todo` into `shards` (each as read back from its file), updating `bar`
    per shard; the generator used (built here when None and a shard is missing, and then
    closed if the stage fails)."""
    if not todo:
        return generator
    cfg, size = plan.generate, plan.candidates.shard_size
    passed = generator
    try:
        if generator is None:
            generator = make_generator(cfg, plan.policy_path, tokenizer, workdir=workdir)
        if tokenizer is None:
            tokenizer = load_tokenizer(plan.policy_path)
        rendered: dict[int, list] = {}

        def jobs():
            for s in todo:
                rows = plan.rows[s * size : (s + 1) * size]
                rendered[s] = render_shard(rows, tokenizer, cfg, plan.prompt_column, first_index=s * size)
                sampling = dataclasses.replace(cfg.sampling(), seed=cfg.seed + s * SHARD_SEED_STRIDE)
                yield ShardJob(s, [r for r in rendered[s] if r.text is not None], sampling)

        for s, gen in stream_shards(generator, jobs(), cfg.num_candidates):
            path = shard_path(plan.gen_dir, s)
            out_rows = shard_rows(
                plan.rows[s * size : (s + 1) * size],
                s * size,
                rendered.pop(s),
                gen,
                generator,
                tokenizer,
                cfg,
                plan.prompt_column,
                plan.candidates.truncated,
                shard=path,
            )
            write_jsonl_atomic(path, out_rows)
            shards[s] = read_shard(path)
            bar.update(len(out_rows))
    except BaseException:
        if generator is not None and generator is not passed:
            close_generator(generator)  # a served policy's server stops with its failed stage too
        raise
    return generator


def generate_stage(
    plan: StagePlan,
    owned: list[int] | None,
    generator: Generator | None,
    redone: dict[str, int],
    tokenizer,
    workdir: Path,
) -> tuple[list[list[dict] | None], Generator | None]:
    """The owned generate shards' rows (None elsewhere), writing the missing (or damaged)
    ones; and the generator used (None if none was needed)."""
    rows, gen_dir = plan.rows, plan.gen_dir
    size = plan.candidates.shard_size
    n_shards = math.ceil(len(rows) / size)
    mine = list(range(n_shards)) if owned is None else owned
    shards: list[list[dict] | None] = [None] * n_shards
    for s in mine:
        planned = prompts_in([s], size, len(rows))
        shards[s] = reuse_shard(
            gen_dir, s, partial(check_generate_shard, first_index=s * size, planned=planned), redone
        )
    todo = [s for s in mine if shards[s] is None]
    total = prompts_in(mine, size, len(rows))
    with progress_bar(
        plan.candidates.progress, total, "generate", done=total - prompts_in(todo, size, len(rows))
    ) as bar:
        generator = generate_missing(plan, todo, shards, generator, tokenizer, workdir, bar)
    return shards, generator


def prompts_in(shards: list[int], shard_size: int, n: int) -> int:
    """How many of the `n` prompts the `shards` (of `shard_size` each) hold."""
    return sum(min(shard_size, n - s * shard_size) for s in shards)
