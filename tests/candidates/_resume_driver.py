"""Run the pipeline in a subprocess (for the kill-and-resume test).

    python _resume_driver.py OUT_DIR POLICY_PATH METHOD

Generation and judging are slowed down (sleeps) so that a SIGKILL lands inside a stage.
Generation streams shards (several in flight); the shards it is handed are appended to
OUT_DIR.requested, one per line.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generators.hf import TransformersGenerator
from pofe_candidates.generators.stream import run_window
from pofe_candidates.pipeline import run_pipeline

SLEEP = 0.4


class SlowGenerator:
    """Prompts one at a time (seed + place in the shard), WINDOW of them in flight across
    shards with uneven delays (generators/stream.py), so shards finish out of order with
    others in flight when the kill lands; each shard handed to it is logged to `requested`."""

    name = "transformers"
    WINDOW = 3

    def __init__(self, inner, requested: Path):
        self.inner, self.requested, self.lock = inner, requested, threading.Lock()

    def generate_stream(self, jobs, n):
        def one(job, i):
            time.sleep(SLEEP * (1 + (job.key + i) % 3) / 3)
            with self.lock:  # one model: its generate calls one at a time
                return (
                    job.key,
                    i,
                    self.inner.generate([job.prompts[i]], n, replace(job.sampling, seed=job.sampling.seed + i))[0],
                )

        def logged():
            for job in jobs:
                with open(self.requested, "a") as f:
                    f.write(f"{job.key}\n")
                yield job

        with ThreadPoolExecutor(self.WINDOW) as pool:
            running = set()

            def wait_some():
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                running.difference_update(done)
                return [f.result() for f in done]

            yield from run_window(
                logged(), self.WINDOW, lambda job, i: running.add(pool.submit(one, job, i)), wait_some
            )


def slow_reward(prompt, response) -> float:
    time.sleep(SLEEP / 4)
    return float(len(response) % 7) + (0.5 if "1" in response else 0.0)


def main() -> None:
    out_dir, policy, method = sys.argv[1:4]
    rows = [{"prompt": f"What is {i} + {i + 1}?", "gold": str(2 * i + 1)} for i in range(12)]
    rows[3]["prompt"] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    gen = GenerateConfig(
        backend="transformers",
        num_candidates=3,
        max_new_tokens=12,
        temperature=1.0,
        seed=7,
        include_dataset_responses=["gold"],
    )
    judge = JudgeConfig(type="python", function="_resume_driver:slow_reward")
    run_pipeline(
        rows,
        policy_path=policy,
        method=method,
        generate=gen,
        judge=judge,
        candidates=CandidatesConfig(out_dir=out_dir, shard_size=2, progress=False),
        generator=SlowGenerator(TransformersGenerator(policy, batch_size=2), Path(out_dir + ".requested")),
    )
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
