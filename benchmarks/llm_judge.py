"""The LLM judge stage's request window across shards, against every request in flight at once.

    python -m benchmarks.llm_judge            # 8 shards x 16 prompts x K = 4, medians of 3
    python -m benchmarks.llm_judge --quick    # 4 shards, 2 repetitions

A served judge model answers each chat request after a latency that grows with the reply it
writes; real replies vary (a verdict, or a rationale first), so latencies are long-tailed. A
loopback server stands in for it (the tests' scripted `FakeServer`): each request sleeps a Pareto-distributed time (alpha 1.5,
median ~25 ms, about one request in 30 over 10x the median), drawn from a seed of the
candidate's text, so every variant meets the same latencies, then answers "Score: n". What is
measured is scheduling only: how long the judge stage keeps its window of `in_flight`
requests busy, wall clock (the process sleeps, so other jobs on the machine barely move it).

- `pofe`: the judge stage as it runs (`pofe_candidates.shards.judged_in_turn`): two shards
  side by side, their requests sharing the judge's one window.
- `per_shard`: one shard at a time, the window drained at each shard's end (POFE before).
- `direct`: every candidate of every shard in one call: the window full until the last
  request, no shards (what an unsharded, unresumable stage could do).

Writes benchmarks/results/llm-judge.json: `overhead_pofe_over_direct` and
`per_shard_over_direct`, medians of interleaved repetitions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.judges import interleaved, write_result
from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges.llm import LLMRubricJudge
from pofe_candidates.openai_client import OpenAIClient
from pofe_candidates.shards import judged_in_turn
from tests.openai_server import FakeServer

ALPHA, SCALE_S = 1.5, 0.016  # Pareto: median SCALE_S * 2 ** (1 / ALPHA) ~ 25 ms


def latency(text: str) -> float:
    """The request's sleep: a Pareto draw seeded by its text (the same in every variant)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return SCALE_S * random.Random(seed).paretovariate(ALPHA)


def slow_judge(path: str, body: dict, attempt: int) -> tuple[int, str, float]:
    """The stand-in server's answer to a chat request: "Score: n" after `latency(content)`."""
    content = body["messages"][0]["content"]
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"Score: {len(content) % 10 + 1}"}}]}
    return 200, json.dumps(reply), latency(content)


def shards(n_shards: int, n_prompts: int, k: int) -> list[tuple[list[str], list[list[str]]]]:
    """Each shard's prompts and candidates, distinct texts so each request draws its own latency."""
    return [
        (
            [f"prompt {s}-{p}" for p in range(n_prompts)],
            [[f"candidate {s}-{p}-{j}" for j in range(k)] for p in range(n_prompts)],
        )
        for s in range(n_shards)
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--window", type=int, default=8, help="judge.in_flight: requests in flight")
    parser.add_argument("--out", default="benchmarks/results/llm-judge.json")
    args = parser.parse_args(argv)
    reps, n_shards, n_prompts, k = args.reps or (2 if args.quick else 3), 4 if args.quick else 8, 16, 4
    work = shards(n_shards, n_prompts, k)
    with FakeServer(slow_judge) as srv:
        cfg = JudgeConfig(type="llm", base_url=srv.url, in_flight=args.window)

        def judge() -> LLMRubricJudge:
            return LLMRubricJudge(OpenAIClient(srv.url), cfg)

        def wall(fn):
            def run() -> float:
                start = time.perf_counter()
                fn()
                return time.perf_counter() - start

            return run

        def pofe():
            j = judge()
            list(judged_in_turn(list(range(n_shards)), lambda s: j.score(*work[s]), side_by_side=2))

        def per_shard():
            for prompts, cands in work:
                judge().score(prompts, cands)  # a window of its own, drained at the shard's end

        def direct():
            judge().score([p for ps, _ in work for p in ps], [c for _, cs in work for c in cs])

        times = interleaved({"pofe": wall(pofe), "per_shard": wall(per_shard), "direct": wall(direct)}, reps)
    med = {name: statistics.median(v) for name, v in times.items()}
    result = {
        "shards": n_shards,
        "prompts_per_shard": n_prompts,
        "k": k,
        "window": args.window,
        "reps": reps,
        "latency": {"pareto_alpha": ALPHA, "scale_s": SCALE_S},
        "seconds_median": med,
        "seconds_all": times,
        "overhead_pofe_over_direct": med["pofe"] / med["direct"],
        "per_shard_over_direct": med["per_shard"] / med["direct"],
    }
    requests = n_shards * n_prompts * k
    print(
        f"LLM judge: {n_shards} shards x {n_prompts} prompts x K = {k} ({requests} requests), window {args.window}, "
        f"medians of {reps}"
    )
    for name, s in med.items():
        print(f"  {name:10s} {s:7.2f} s   {s / med['direct']:.2f}x direct")
    write_result(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
