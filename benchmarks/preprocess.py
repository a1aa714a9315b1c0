"""POFE's generate stage against the same engine called directly, and judge calls per prompt.

    python -m benchmarks.preprocess            # tiny local Llama, transformers backend
    python -m benchmarks.preprocess --quick

Both variants share one loaded generator, the same rendered prompts and the same seed,
interleaved repetition by repetition (medians). `direct` is the engine's own
`generate(prompts, n, sampling)`; `pofe` is `run_pipeline(..., stop_after="generate")`,
which adds rendering, dataset responses, dedupe, token counts and atomic shard writes.
Judge calls per prompt are counted by a python judge that counts its own calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

CALLS = {"n": 0}


def counting_reward(prompt, response) -> float:
    """The toy task's reward, counting calls (the python judge calls it once per candidate)."""
    from pofe.demo.task import reward

    CALLS["n"] += 1
    return reward(prompt, response)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--out", default="benchmarks/results/preprocess-cpu.json")
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 5)
    n_prompts, k = (16, 4) if args.quick else (64, 8)
    torch.set_num_threads(1)

    from pofe.demo.task import make_prompts
    from pofe.demo.tiny import build_tiny_model
    from pofe.preprocess.config import GenerateConfig, JudgeConfig, PipelineConfig
    from pofe.preprocess.generators import make_generator
    from pofe.preprocess.generators.hf import load_tokenizer
    from pofe.preprocess.pipeline import run_pipeline
    from pofe.preprocess.render import render_prompt

    work = Path(tempfile.mkdtemp(prefix="pofe-bench-"))
    policy = str(build_tiny_model(work / "model"))
    rows = [{"prompt": p} for p in make_prompts(n_prompts, seed=0)]
    gen_cfg = GenerateConfig(num_candidates=k, temperature=1.0, max_new_tokens=16, batch_size=16)
    judge_cfg = JudgeConfig(type="python", function=f"{__name__}:counting_reward")
    generator = make_generator(gen_cfg, policy)
    tokenizer = load_tokenizer(policy)
    rendered = [render_prompt(tokenizer, r["prompt"]).text for r in rows]

    def direct(rep):
        generator.generate(rendered, k, gen_cfg.sampling())

    def pofe(rep):
        run_pipeline(rows, policy_path=policy, method="rrhf", generate=gen_cfg, judge=judge_cfg,
                     candidates=PipelineConfig(out_dir=str(work / f"gen-{rep}"), shard_size=n_prompts, progress=False),
                     generator=generator, stop_after="generate")

    times: dict[str, list[float]] = {"direct": [], "pofe": []}
    for rep in range(reps):
        order = [("direct", direct), ("pofe", pofe)][:: 1 if rep % 2 == 0 else -1]
        for name, fn in order:
            start = time.perf_counter()
            fn(rep)
            times[name].append(time.perf_counter() - start)

    CALLS["n"] = 0
    result = run_pipeline(rows, policy_path=policy, method="rrhf", generate=gen_cfg,
                          judge=judge_cfg, generator=generator,
                          candidates=PipelineConfig(out_dir=str(work / "full"), shard_size=n_prompts, progress=False))
    med = {name: statistics.median(v) for name, v in times.items()}
    out = {
        "prompts": n_prompts,
        "k": k,
        "reps": reps,
        "seconds_median": med,
        "seconds_all": times,
        "candidates_per_second": {n: n_prompts * k / s for n, s in med.items()},
        "overhead_pofe_over_direct": med["pofe"] / med["direct"],
        "judge_calls_per_prompt": CALLS["n"] / n_prompts,
        "candidates_per_prompt_after_dedupe": result.summary["candidates_per_prompt"]["mean"],
    }
    print(f"generate stage: {n_prompts} prompts x {k} samples, medians of {reps}")
    print(f"  direct engine   {med['direct']:.2f} s")
    print(f"  pofe stage      {med['pofe']:.2f} s   overhead {out['overhead_pofe_over_direct']:.3f}x")
    print(f"  python judge calls per prompt: {out['judge_calls_per_prompt']:.2f} "
          f"(= candidates after dedupe, {out['candidates_per_prompt_after_dedupe']:.2f})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
