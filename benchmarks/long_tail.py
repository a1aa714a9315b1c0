"""The `long_tail` workload: per-prompt output lengths as real samples have them.

Each request's `max_tokens` is drawn from a Pareto distribution keyed by the request's seed
(`tail_tokens`), and EOS is ignored, so every prompt's n samples run exactly that long:
median ~8 tokens, about one prompt in 25 over 10x the median, capped at `CAP`. POFE and the
direct calls send the same seeds (`pofe_seeds`: POFE's per shard and per prompt), hence the
same lengths and the same samples.

In process (run inside the vLLM venv, the `pofe` package on PYTHONPATH as the tests lay it out):

    VENV/bin/python -m benchmarks.long_tail POLICY OUT_JSON PROMPTS K SHARD REPS

times, interleaved: `direct` (one `LLM.generate` over all prompts), `pofe` (run_pipeline's
generate stage, shards streamed through one engine) and `per_shard` (one `generate` call per
shard on the same engine: what POFE did before the stream).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

XM, ALPHA, CAP = 4, 1.1, 128


def tail_tokens(seed: int) -> int:
    """A request's output length, a deterministic Pareto(XM, ALPHA) draw for its seed."""
    u = random.Random(seed).random()
    return max(1, min(CAP, int(XM / (1.0 - u) ** (1.0 / ALPHA))))


def pofe_seeds(n_prompts: int, shard_size: int, seed: int) -> list[int]:
    """The seed POFE sends for each prompt (pipeline: seed + shard * stride + place in the shard)."""
    from pofe_candidates.generate_stage import SHARD_SEED_STRIDE

    return [seed + (j // shard_size) * SHARD_SEED_STRIDE + j % shard_size for j in range(n_prompts)]


def length_stats(n_prompts: int, shard_size: int, seed: int) -> dict:
    lengths = [tail_tokens(s) for s in pofe_seeds(n_prompts, shard_size, seed)]
    med = statistics.median(lengths)
    return {
        "median_tokens": med,
        "max_tokens": max(lengths),
        "prompts_over_10x_median": sum(x > 10 * med for x in lengths),
    }


def openai_generator(client, model: str, window: int):
    """POFE's openai backend, each request's max_tokens its tail draw (EOS ignored)."""
    from pofe_candidates.generators.openai import OpenAIGenerator

    class LongTailOpenAI(OpenAIGenerator):
        def _payload(self, prompt, n, sampling, seed):
            return {**super()._payload(prompt, n, sampling, seed), "max_tokens": tail_tokens(seed), "ignore_eos": True}

    return LongTailOpenAI(client, model, concurrency=window)


def _vllm_generator(policy: str, **kwargs):
    from pofe_candidates.generators.vllm import VLLMGenerator

    class LongTailVLLM(VLLMGenerator):
        def _params(self, n, sampling, seed):
            params = super()._params(n, sampling, seed)
            params.max_tokens, params.ignore_eos = tail_tokens(seed), True
            return params

    return LongTailVLLM(policy, **kwargs)


def measure_inprocess(policy: str, n_prompts: int, k: int, shard_size: int, reps: int, work: Path) -> dict:
    from pofe.demo.task import make_prompts
    from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
    from pofe_candidates.models import load_tokenizer
    from pofe_candidates.pipeline import run_pipeline
    from pofe_candidates.render import render_prompt

    rows = [{"prompt": p} for p in make_prompts(n_prompts, seed=0)]
    cfg = GenerateConfig(backend="vllm", num_candidates=k, temperature=1.0, max_new_tokens=CAP, seed=0)
    gen = _vllm_generator(policy, dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
    tok = load_tokenizer(policy)
    rendered = [render_prompt(tok, r["prompt"]) for r in rows]
    seeds = pofe_seeds(n_prompts, shard_size, cfg.seed)
    sampling = cfg.sampling()

    def direct(rep):
        gen.llm.generate(
            [{"prompt_token_ids": r.ids} for r in rendered],
            [gen._params(k, sampling, s) for s in seeds],
            use_tqdm=False,
        )

    def pofe(rep):
        run_pipeline(
            rows,
            policy_path=policy,
            method="rrhf",
            generate=cfg,
            judge=JudgeConfig(type="python", function="pofe.demo.task:reward"),
            generator=gen,
            stop_after="generate",
            candidates=CandidatesConfig(out_dir=str(work / f"gen-{rep}"), shard_size=shard_size, progress=False),
        )

    def per_shard(rep):
        import dataclasses

        for s in range(0, n_prompts, shard_size):
            shard_sampling = dataclasses.replace(sampling, seed=seeds[s])
            gen.generate(rendered[s : s + shard_size], k, shard_sampling)

    return interleave({"direct": direct, "pofe": pofe, "per_shard": per_shard}, reps)


def interleave(variants: dict, reps: int) -> dict[str, list[float]]:
    """Seconds per repetition of each variant, the order rotating every repetition."""
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            start = time.perf_counter()
            variants[name](rep)
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    policy, out, n_prompts, k, shard_size, reps = sys.argv[1:7]
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="pofe-tail-"))
    times = measure_inprocess(policy, int(n_prompts), int(k), int(shard_size), int(reps), work)
    Path(out).write_text(json.dumps(times))


if __name__ == "__main__":
    main()
