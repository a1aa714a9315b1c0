"""GPM's K forwards against PairRM's K (K - 1) pairs: judging time for K = 5 and 8.

    python -m benchmarks.gpm              # CPU, 16 prompts, K = 5 and 8, medians of 5
    python -m benchmarks.gpm --quick      # 4 prompts, 2 repetitions
    python -m benchmarks.gpm --device cuda

Both judges turn one prompt's K candidates into a (K, K) preference matrix: GPM
(`GPMJudge.preferences`) runs one forward per candidate and compares the embeddings, PairRM
(`PairRMJudge.preferences`) one forward per ordered pair. Tiny random checkpoints of one size:
GPM in the authors' layout (tests/candidates/gpm_checkpoint.py: the tiny Llama, width 128, 2
layers, a 6-dim value head and a prompt head; character-level chat tokenizer), PairRM in
llm-blender's (benchmarks/judges.py's: DeBERTa-v3 architecture, width 128, 2 layers, budgets
128 : 64 : 64 sentencepiece tokens). GPM reads each prompt and response whole (judge.max_length
1024; its tokenizer has one token per character, so its inputs are the longer), PairRM within
its budgets; float32, batches of 8 (candidates for GPM, pairs for PairRM). Same texts
(log-normal word counts: prompts of median 12 words, candidates 24), same device and thread
count, one run, repetitions interleaved, medians; CPU seconds of the timed process on the CPU,
wall clock on CUDA. The ratio is PairRM's seconds over GPM's, per K; the forwards and the
tokens each judge ran say how much of it is the forward count and how much the inputs' lengths.

Writes benchmarks/results/gpm-<device>.json.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import torch

from benchmarks.judges import PAIRRM_ENCODER, PAIRRM_LENGTHS, interleaved, summary, texts, timed, write_result

GPM_MAX_LENGTH = 1024  # no input of these texts is cut


def tokens_run(judge, prompts: list[str], candidates: list[list[str]]) -> int:
    """The tokens the judge's forwards read for these inputs (padding not counted)."""
    from pofe_candidates.judges.gpm import GPMJudge
    from pofe_candidates.judges.pairrm_inputs import encode_prompts

    if isinstance(judge, GPMJudge):
        return sum(len(e.ids) for row in judge.encode(prompts, candidates) for e in row)
    m = judge.model
    return sum(len(ids) for *_, ids in encode_prompts(judge.tokenizer, m.settings, m.prefix_ids, prompts, candidates))


def checkpoints(work: Path) -> tuple[Path, Path]:
    """(GPM, PairRM): the two tiny checkpoints (module docstring)."""
    from tests.candidates import make_pairrm_reference as reference
    from tests.candidates.gpm_checkpoint import write_gpm_checkpoint

    gpm = write_gpm_checkpoint(work / "gpm", hidden=128, value_dim=6)
    return gpm, reference.build_checkpoint(work / "pairrm", encoder=PAIRRM_ENCODER, ranker_config=PAIRRM_LENGTHS)


def compare(gpm_dir: Path, pairrm_dir: Path, n_prompts: int, k: int, reps: int, device: str) -> dict:
    from pofe_candidates.judges.gpm import GPMJudge
    from pofe_candidates.judges.pairrm import PairRMJudge
    from tests.candidates.make_pairrm_reference import CORPUS

    rng = random.Random(k)
    prompts = texts(n_prompts, 12, rng, CORPUS)
    candidates = [texts(k, 24, rng, CORPUS) for _ in range(n_prompts)]
    gpm = GPMJudge.from_pretrained(str(gpm_dir), max_length=GPM_MAX_LENGTH, device=device)
    pairrm = PairRMJudge.from_pretrained(str(pairrm_dir), device=device)
    variants = {
        "gpm": timed(lambda: gpm.preferences(prompts, candidates), device),
        "pairrm": timed(lambda: pairrm.preferences(prompts, candidates), device),
    }
    interleaved(variants, 1)  # warm-up
    out = summary(interleaved(variants, reps), n_prompts, ours="gpm")
    out["forwards"] = {"gpm": n_prompts * k, "pairrm": n_prompts * k * (k - 1)}
    out["tokens"] = {"gpm": tokens_run(gpm, prompts, candidates), "pairrm": tokens_run(pairrm, prompts, candidates)}
    out["gpm_inputs_cut"] = sum(e.cut for row in gpm.encode(prompts, candidates) for e in row)
    out["pairrm_seconds_over_gpm"] = out["seconds_median"]["pairrm"] / out["seconds_median"]["gpm"]
    return {"prompts": n_prompts, "k": k, **out}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="default benchmarks/results/gpm-<device>.json")
    args = parser.parse_args(argv)
    reps, n_prompts = args.reps or (2 if args.quick else 5), args.prompts or (4 if args.quick else 16)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="pofe-gpm-") as tmp:
        result = {"device": args.device, "threads": args.threads, "reps": reps, "gpm_max_length": GPM_MAX_LENGTH}
        gpm_dir, pairrm_dir = checkpoints(Path(tmp))
        result["by_k"] = {str(k): compare(gpm_dir, pairrm_dir, n_prompts, k, reps, args.device) for k in (5, 8)}
    print(f"GPM vs PairRM, {n_prompts} prompts, medians of {reps} ({args.device}, {args.threads} thread(s))")
    print(f"  {'K':>2} {'GPM s':>8} {'PairRM s':>9} {'PairRM / GPM':>13} {'forwards':>12} {'tokens':>14}")
    for k, r in result["by_k"].items():
        s, f, t = r["seconds_median"], r["forwards"], r["tokens"]
        print(
            f"  {k:>2} {s['gpm']:8.3f} {s['pairrm']:9.3f} {r['pairrm_seconds_over_gpm']:12.2f}x "
            f"{f['gpm']:>5} / {f['pairrm']:<5} {t['gpm']:>6} / {t['pairrm']:<6}"
        )
    write_result(Path(args.out or f"benchmarks/results/gpm-{args.device}.json"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
