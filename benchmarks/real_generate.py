"""The generate stage on the real model: transformers against vLLM's CPU server, tokens per second.

    python -m benchmarks.preprocess --model .real-model/SmolLM2-135M-Instruct --prompts 64 --k 4 --max-new-tokens 64

Both variants are POFE's generate stage (`run_pipeline(..., stop_after="generate")`) on the same
rows (`pofe.demo.real_task` questions), rendered by the model's own tokenizer and chat template,
with the same k, max_new_tokens, temperature 1 and seed: `transformers` loads the model in this
process (float32, batches of 16 prompts); `vllm` is the vLLM CPU venv's OpenAI-compatible server
on loopback (float32, eager, prefills not chunked: see `compare`), POFE's `openai` backend with
its default window. Each engine runs on one thread (this process's torch; the server's OpenMP
unbound, `VLLM_CPU_OMP_THREADS_BIND=nobind`, `OMP_NUM_THREADS=1`), so the ratio compares
engines, not core counts. Tokens are what each engine sampled (every candidate's ids, its stop
token included), counted as they come back: the engines draw different samples, so tokens per
second is the fair figure, not seconds. Repetitions alternate (the order flipping each time);
medians, with each repetition's ratio.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from pofe_candidates.generators.interface import sampled_ids


class CountingGenerator:
    """A generator that counts the tokens it hands back (its candidates' sampled ids)."""

    def __init__(self, inner):
        self.inner, self.tokens = inner, 0
        if hasattr(inner, "generate_stream"):  # stream_shards takes the backend's streaming path if it has one
            self.generate_stream = self._stream

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, n, sampling):
        return self._count(self.inner.generate(prompts, n, sampling))

    def _stream(self, jobs, n):
        for key, out in self.inner.generate_stream(jobs, n):
            yield key, self._count(out)

    def _count(self, out):
        for candidates in out:
            for c in candidates:
                ids = sampled_ids(c)
                if ids is None:
                    raise SystemExit(f"{type(self.inner).__name__} gave no token ids: cannot count its tokens")
                self.tokens += len(ids)
        return out


def compare(model: str, work: Path, n_prompts: int, k: int, reps: int, max_new_tokens: int, vllm_python) -> dict:
    """tokens/s of POFE's generate stage on `model`, transformers vs vLLM's server, alternating."""
    import torch

    from pofe.demo.real_task import make_prompt_rows
    from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
    from pofe_candidates.generators import make_generator
    from pofe_candidates.pipeline import run_pipeline
    from tests.vllm_server import vllm_server

    torch.set_num_threads(1)
    # the server's engine on one unbound thread, as this process's torch (it reads these at start)
    os.environ.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
    rows = [{"prompt": r["prompt"]} for r in make_prompt_rows(n_prompts, seed=0)]
    same = {"num_candidates": k, "temperature": 1.0, "max_new_tokens": max_new_tokens, "dedupe": False}
    judge = JudgeConfig(type="python", function="pofe.demo.real_task:reward")
    # vllm-cpu 0.32 crashes on a seeded request whose prefill is chunked ("CPU Generator does not
    # use offset"): with 32 prompts x 4 in flight the token budget splits one; whole prefills only
    with vllm_server(vllm_python, model, work / "vllm-server.log", args=["--no-enable-chunked-prefill"]) as url:
        configs = {
            "transformers": GenerateConfig(batch_size=16, **same),
            "vllm": GenerateConfig(backend="openai", base_url=url, model=model, **same),
        }
        generators = {name: CountingGenerator(make_generator(cfg, model)) for name, cfg in configs.items()}
        runs: dict[str, list[dict]] = {name: [] for name in configs}
        for rep in range(reps):
            for name in list(configs)[:: 1 if rep % 2 == 0 else -1]:
                gen = generators[name]
                gen.tokens, start = 0, time.perf_counter()
                run_pipeline(
                    rows,
                    policy_path=model,
                    method="rrhf",
                    generate=configs[name],
                    judge=judge,
                    candidates=CandidatesConfig(
                        out_dir=str(work / f"{name}-{rep}"), shard_size=n_prompts, progress=False
                    ),
                    generator=gen,
                    stop_after="generate",
                )
                seconds = time.perf_counter() - start
                runs[name].append({"seconds": seconds, "tokens": gen.tokens, "tokens_per_s": gen.tokens / seconds})
        window = generators["vllm"].concurrency
    ratios = [v["tokens_per_s"] / t["tokens_per_s"] for v, t in zip(runs["vllm"], runs["transformers"])]
    med = {name: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for name, rs in runs.items()}
    return {
        "model": model,
        "prompts": n_prompts,
        "k": k,
        "max_new_tokens": max_new_tokens,
        "threads": 1,
        "vllm_window": window,
        "reps": reps,
        "median": med,
        "runs": runs,
        "tokens_per_s_vllm_over_transformers": {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "each": ratios,
        },
        "load_average_at_end": os.getloadavg(),
    }


def report(out: dict) -> None:
    med, ratio = out["median"], out["tokens_per_s_vllm_over_transformers"]
    print(
        f"generate stage on {out['model']}: {out['prompts']} prompts x {out['k']} samples, up to "
        f"{out['max_new_tokens']} tokens, one thread each, medians of {out['reps']}"
    )
    for name, m in med.items():
        print(f"  {name:12s} {m['tokens_per_s']:8.1f} tokens/s  ({m['tokens']:.0f} tokens in {m['seconds']:.1f} s)")
    print(f"  vllm / transformers tokens/s: {ratio['median']:.2f}x (min {ratio['min']:.2f}, max {ratio['max']:.2f})")
