"""POFE's judges against the judges' own libraries: PairRM and a reward model, pairs/s.

    python -m benchmarks.judges            # CPU, 48 prompts x K = 5, medians of 5
    python -m benchmarks.judges --quick    # 8 prompts, 2 repetitions
    python -m benchmarks.judges --device cuda

Same texts, same device, same thread count, one run; repetitions interleaved (the order
rotating) and the median taken. Seconds are wall clock on CUDA and CPU seconds of the
timed process on the CPU (`clock`). Texts are words of a fixed corpus with long-tailed lengths
(log-normal: some candidates several times the median), so batches see real padding.

PairRM. A seeded checkpoint in llm-blender/PairRM's layout (tests/candidates/
make_pairrm_reference.py, sized up: DeBERTa-v3 architecture, hidden 128, 2 layers, the
source : candidate budget 128 : 64 : 64), float32. `pofe` is `PairRMJudge.preferences` at
its default batch of 8 pairs. The reference is llm-blender 0.0.2 itself, in the parity
test's venv (`.venv-pairrm`, `PAIRRM_VENV`; .ci/pairrm-reference.sh builds it), driven by
benchmarks/blender_worker.py: `Blender.rank(return_scores=True)` at batch_size 1 (how the
SPPO scripts call it; the only size at which its inputs equal POFE's, see pairrm.py) and
at its default 8, and `Blender.compare(mode="[A,B]+[B,A]")` over every unordered pair at
its default 4. Every variant judges the same K (K - 1) ordered pairs per prompt.

Reward model. A random LlamaForSequenceClassification (hidden 128, 2 layers) with the
tiny chat tokenizer; `pofe` is `RewardModelJudge.score`, `plain` the same model called as
a user would without POFE: the chat template applied, one tokenizer call, batches of the
same size sorted by length, padded, `logits[:, 0]`. `pofe` shares each prompt's prefix across
its K candidates (judge.prefix_sharing, the default); `pofe_whole_texts` is the judge with it
off, scoring every whole text as `plain` does.

Writes benchmarks/results/judges-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PAIRRM_ENCODER = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
PAIRRM_LENGTHS = {"source_maxlength": 128, "candidate_maxlength": 64}


def texts(n: int, median_words: float, rng: random.Random, corpus: list[str]) -> list[str]:
    """n texts of log-normal word counts (sigma 0.8: the 95th percentile ~3.7x the median)."""
    return [
        " ".join(rng.choice(corpus) for _ in range(max(1, round(rng.lognormvariate(0, 0.8) * median_words))))
        for _ in range(n)
    ]


def interleaved(variants: dict, reps: int) -> dict[str, list[float]]:
    """Seconds per repetition of each variant, the order rotating each repetition."""
    names, times = list(variants), {name: [] for name in variants}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            times[name].append(variants[name]())
    return times


def clock(device: str):
    """CUDA: wall clock. CPU: the process's CPU time (all its threads), which other jobs on a
    shared machine do not inflate as they do wall time."""
    return time.perf_counter if device == "cuda" else time.process_time


def timed(fn, device: str):
    def run() -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = clock(device)()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return clock(device)() - start

    return run


def summary(times: dict[str, list[float]], pairs: int, ours: str = "pofe") -> dict:
    med = {name: statistics.median(v) for name, v in times.items()}
    rate = {name: pairs / s for name, s in med.items()}
    return {
        "seconds_median": med,
        "seconds_all": times,
        "per_second": rate,
        "speed_pofe_over": {name: rate[ours] / r for name, r in rate.items() if name != ours},
    }


class BlenderWorker:
    """benchmarks/blender_worker.py in the llm-blender venv, one command per timing."""

    def __init__(self, ranker: Path, inputs: Path, device: str, threads: int):
        py = Path(os.environ.get("PAIRRM_VENV", REPO / ".venv-pairrm")) / "bin" / "python"
        if not py.exists():
            raise SystemExit(
                f"{py} not found: build llm-blender's venv with .ci/pairrm-reference.sh (or set PAIRRM_VENV)"
            )
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [str(py), str(REPO / "benchmarks" / "blender_worker.py"), str(ranker), str(inputs), device, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._read()  # {"ready": true} once loaded

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"blender_worker.py exited ({self.proc.wait()}); its error is printed above")
        return json.loads(line)

    def call(self, op: str, batch_size: int) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, "batch_size": batch_size}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def pairrm(work: Path, n_prompts: int, k: int, reps: int, device: str, threads: int) -> dict:
    from pofe_candidates.judges.pairrm import PairRMJudge
    from tests.candidates import make_pairrm_reference as reference

    rng = random.Random(0)
    sources = texts(n_prompts, 20, rng, reference.CORPUS)
    candidates = [texts(k, 24, rng, reference.CORPUS) for _ in range(n_prompts)]
    ranker = reference.build_checkpoint(work, encoder=PAIRRM_ENCODER, ranker_config=PAIRRM_LENGTHS)
    (work / "inputs.json").write_text(json.dumps({"sources": sources, "candidates": candidates}))
    blender = BlenderWorker(ranker, work / "inputs.json", device, threads)
    judge = PairRMJudge.from_pretrained(str(ranker), device=device)  # default batch of 8 pairs
    try:
        variants = {
            "pofe": timed(lambda: judge.preferences(sources, candidates), device),
            "blender_rank_bs1": lambda: blender.call("rank", 1)["seconds"],
            "blender_rank_bs8": lambda: blender.call("rank", 8)["seconds"],
            "blender_compare_bs4": lambda: blender.call("compare", 4)["seconds"],
        }
        interleaved(variants, 1)  # warm-up
        out = summary(interleaved(variants, reps), n_prompts * k * (k - 1))
        theirs = torch.tensor(blender.call("rank", 1)["scores"])
    finally:
        blender.close()
    ours = torch.stack([(c - c.T).mean(dim=1) for c in judge.logit_matrices(sources, candidates)])
    out["max_abs_rank_score_difference_vs_blender_bs1"] = (ours - theirs).abs().max().item()
    return {"prompts": n_prompts, "k": k, "pairs": n_prompts * k * (k - 1), **out}


def reward_model(work: Path, n_prompts: int, k: int, reps: int, device: str, batch_size: int = 8) -> dict:
    from transformers import LlamaForSequenceClassification

    from pofe.batching import length_sorted_batches
    from pofe.demo.tiny import build_config, build_tokenizer
    from pofe_candidates.judges.reward_model import RewardModelJudge
    from tests.candidates.make_pairrm_reference import CORPUS

    tok = build_tokenizer()
    cfg = build_config(tok, hidden_size=128, num_layers=2)
    cfg.num_labels = 1
    torch.manual_seed(0)
    LlamaForSequenceClassification(cfg).save_pretrained(work / "rm")
    tok.save_pretrained(work / "rm")
    rng = random.Random(1)
    prompts = texts(n_prompts, 12, rng, CORPUS)
    responses = [texts(k, 16, rng, CORPUS) for _ in range(n_prompts)]
    judge = RewardModelJudge(str(work / "rm"), batch_size=batch_size, max_length=4096)
    whole = RewardModelJudge(str(work / "rm"), batch_size=batch_size, max_length=4096, prefix_sharing=False)
    model, tok = judge.model, judge.tokenizer

    @torch.no_grad()
    def plain() -> list[float]:
        chats = [
            tok.apply_chat_template(
                [{"role": "user", "content": p}, {"role": "assistant", "content": r}], tokenize=False
            )
            for p, rs in zip(prompts, responses)
            for r in rs
        ]
        ids = tok(chats, add_special_tokens=False)["input_ids"]
        scores = [0.0] * len(ids)
        for batch in length_sorted_batches([len(i) for i in ids], batch_size):
            padded = tok.pad({"input_ids": [ids[n] for n in batch]}, return_tensors="pt").to(model.device)
            for n, s in zip(batch, model(**padded).logits[:, 0].tolist()):
                scores[n] = s
        return scores

    variants = {
        "pofe": timed(lambda: judge.score(prompts, responses), device),
        "pofe_whole_texts": timed(lambda: whole.score(prompts, responses), device),
        "plain": timed(plain, device),
    }
    interleaved(variants, 1)  # warm-up
    out = summary(interleaved(variants, reps), n_prompts * k)
    ours = torch.tensor([s for row in judge.score(prompts, responses) for s in row])
    out["max_abs_score_difference_vs_plain"] = (ours - torch.tensor(plain())).abs().max().item()
    # what float rounding of the two orders may differ by scales with these (gpu_check/judges.py)
    out["max_abs_score"] = ours.abs().max().item()
    out["longest_input_tokens"] = max(
        len(e.inputs["input_ids"]) for e in judge.encode_all([(p, r) for p, rs in zip(prompts, responses) for r in rs])
    )
    out["hidden_size"] = cfg.hidden_size
    return {"prompts": n_prompts, "k": k, "candidates": n_prompts * k, "batch_size": batch_size, **out}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="default benchmarks/results/judges-<device>.json")
    args = parser.parse_args(argv)
    reps, n_prompts, k = args.reps or (2 if args.quick else 5), args.prompts or (8 if args.quick else 48), 5
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="pofe-judges-") as tmp:
        result = {
            "device": args.device,
            "threads": args.threads,
            "reps": reps,
            "pairrm": pairrm(Path(tmp) / "pairrm", n_prompts, k, reps, args.device, args.threads),
            "reward_model": reward_model(Path(tmp), n_prompts, k, reps, args.device),
        }
    for name, unit in (("pairrm", "pairs"), ("reward_model", "candidates")):
        r = result[name]
        print(f"{name}: {r[unit]} {unit}, medians of {reps}")
        for variant, rate in r["per_second"].items():
            vs = "" if variant == "pofe" else f"   pofe {r['speed_pofe_over'][variant]:.2f}x"
            print(f"  {variant:22s} {rate:9.1f} {unit}/s{vs}")
    write_result(Path(args.out or f"benchmarks/results/judges-{args.device}.json"), result)
    return 0


def write_result(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
