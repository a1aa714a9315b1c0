"""Run the pipeline in a subprocess (for the kill-and-resume test).

    python _resume_driver.py OUT_DIR POLICY_PATH METHOD

Generation and judging are slowed down (sleeps) so that a SIGKILL lands inside a stage.
"""

from __future__ import annotations

import sys
import time

from pofe.preprocess.config import GenerateConfig, JudgeConfig, PipelineConfig
from pofe.preprocess.generators.hf import TransformersGenerator
from pofe.preprocess.pipeline import run_pipeline

SLEEP = 0.4


class SlowGenerator:
    name = "transformers"

    def __init__(self, inner):
        self.inner = inner

    def generate(self, prompts, n, sampling):
        time.sleep(SLEEP)
        return self.inner.generate(prompts, n, sampling)


def slow_reward(prompt, response) -> float:
    time.sleep(SLEEP / 4)
    return float(len(response) % 7) + (0.5 if "1" in response else 0.0)


def main() -> None:
    out_dir, policy, method = sys.argv[1:4]
    rows = [{"prompt": f"What is {i} + {i + 1}?", "gold": str(2 * i + 1)} for i in range(12)]
    rows[3]["prompt"] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    gen = GenerateConfig(
        backend="transformers", num_candidates=3, max_new_tokens=12, temperature=1.0, seed=7,
        include_dataset_responses=["gold"],
    )
    judge = JudgeConfig(type="python", function="_resume_driver:slow_reward")
    run_pipeline(
        rows, policy_path=policy, method=method, generate=gen, judge=judge,
        candidates=PipelineConfig(out_dir=out_dir, shard_size=2, progress=False), generator=SlowGenerator(TransformersGenerator(policy, batch_size=2)),
    )
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
