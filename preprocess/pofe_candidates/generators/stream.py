"""Many shards in the engine at once: each shard's candidates the moment its last prompt ends.

One `generate` call per shard drains the engine at every shard's end: its last long samples
run while the other batch slots idle. Instead the stage hands the backend an iterator of
`ShardJob`s and the backend keeps `window` prompts in flight across shard boundaries
(`run_window`), topping up from later shards as prompts finish, and yields each shard whole
as soon as it completes (usually, not necessarily, in shard order). Resumability does not
change: the caller writes each yielded shard atomically; a prompt's samples depend only on
its seed (`sampling.seed + i`, i its place in the shard), never on what else ran with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from pofe_candidates.config import Sampling
from pofe_candidates.generators.interface import Generator
from pofe_candidates.render import Rendered

# (shard key, prompt's place in the shard, its n candidates)
Finished = tuple[int, int, list]


@dataclass(frozen=True)
class ShardJob:
    """One shard's prompts to sample (`key`: the shard's number) and its sampling settings
    (seed: the shard's; prompt i samples with seed + i)."""

    key: int
    prompts: list[Rendered]
    sampling: Sampling


def run_window(
    jobs: Iterable[ShardJob],
    window: int,
    submit: Callable[[ShardJob, int], None],
    wait: Callable[[], list[Finished]],
) -> Iterator[tuple[int, list]]:
    """Keep at least `window` prompts in flight while jobs remain (whole shards are added, so
    up to window + one shard), and yield (key, candidates per prompt) for each shard once its
    last prompt finished. `submit(job, i)` starts prompt i of `job`; `wait()` blocks until at
    least one started prompt finished and returns those. A job with no prompts is yielded at
    once. Errors from either callable propagate (shards yielded before stay yielded)."""
    if window < 1:
        raise ValueError(f"the in-flight window must be at least 1 prompt, got {window}")
    todo = iter(jobs)
    results: dict[int, list] = {}
    missing: dict[int, int] = {}
    in_flight = 0
    exhausted = False
    while True:
        while not exhausted and in_flight < window:
            job = next(todo, None)
            if job is None:
                exhausted = True
            elif not job.prompts:
                yield job.key, []
            else:
                if job.key in missing:
                    raise ValueError(f"shard {job.key} was handed to the engine twice")
                results[job.key], missing[job.key] = [None] * len(job.prompts), len(job.prompts)
                for i in range(len(job.prompts)):
                    submit(job, i)
                in_flight += len(job.prompts)
        if in_flight == 0:
            return
        for key, i, candidates in wait():
            in_flight -= 1
            results[key][i] = candidates
            missing[key] -= 1
            if missing[key] == 0:
                del missing[key]
                yield key, results.pop(key)


def stream_shards(generator: Generator, jobs: Iterable[ShardJob], n: int) -> Iterator[tuple[int, list]]:
    """(key, P lists of n candidates) per job, each as soon as it is done: through the
    backend's `generate_stream` where it has one (vllm, openai), else one `generate` call
    per job in order (transformers: one process's batches, nothing to overlap)."""
    many = getattr(generator, "generate_stream", None)
    if many is not None:
        yield from many(jobs, n)
        return
    for job in jobs:
        yield job.key, generator.generate(job.prompts, n, job.sampling) if job.prompts else []


def one_job(
    stream: Callable[[Iterable[ShardJob], int], Iterator[tuple[int, list]]],
    prompts: list[Rendered],
    n: int,
    sampling: Sampling,
) -> list:
    """`generate` through a backend's `generate_stream`: the prompts as one job."""
    return next((out for _, out in stream([ShardJob(0, list(prompts), sampling)], n)), [])
