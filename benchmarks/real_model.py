"""A real instruct model improved by each method on the CPU: SmolLM2-135M-Instruct (`python -m
pofe.demo --prepare-real`) on two-digit additions asked in words (`pofe.demo.real_task`).

    python -m benchmarks.real_model --method rrhf --seed 0     # ~10 min on 2 cores
    python -m benchmarks.real_model --method sppo --seed 1
    python -m benchmarks.real_model --method nash_md --seed 2

Per run: `axolotl preprocess` samples 4 answers per training prompt from the model (temperature
1, transformers), adds the dataset's answer (as the RRHF paper adds a dataset's responses), and the
verifier judges them (1 when the last integer is the sum); `axolotl train` trains a LoRA adapter
(r 16 on every linear layer). Then the model before and the adapter after answer the held-out
prompts greedily; the table gives each one's accuracy and the gain with its 95 % interval, a
paired bootstrap over held-out prompts (`pofe.run.evaluation.statistics`, 1,000 draws).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from pofe.demo import real_task, smollm2
from pofe.run.evaluation.statistics import percentile_interval, prompt_resamples
from pofe_candidates.config import Sampling
from pofe_candidates.generators.hf import load_policy, load_tokenizer, sample_responses
from pofe_candidates.render import render_prompt

ROOT = Path(__file__).resolve().parents[1]
CPU = {
    "bf16": False,
    "fp16": False,
    "tf32": False,
    "attn_implementation": "sdpa",
    "sample_packing": False,
    "optimizer": "adamw_torch",
    "dataloader_num_workers": 0,
    "lora_mlp_kernel": False,
    "lora_qkv_kernel": False,
    "lora_o_kernel": False,
    "lora_embedding_kernel": False,
}
METHOD = {
    "rrhf": {"rl": "rrhf", "pofe": {"rank_weight": 1.0}},
    # self-play: the model's own samples only. With the dataset's answer among them (a bare number,
    # nearly always the winner) the model learnt the bare-number form without the sums: greedy
    # answers "102", "11" to most questions, held-out 0.13 -> 0.03 (seed 0, benchmarks/README.md)
    "sppo": {
        "rl": "sppo",
        "pofe": {
            "eta": 10.0,
            "generate": {"include_dataset_responses": None},
            "judge": {"preferences": "hard"},
            "candidates": {"keep": "best_worst"},
        },
    },
    # online: every step the policy samples, the mixture pi^0.875 pi_0^0.125 samples an opponent for
    # each sample, the verifier says which wins (a tie: 1/2); the model itself is pi_0, no SFT first
    "nash_md": {
        "rl": "nash_md",
        "pofe": {
            "nash_md": {"mixture_coef": 0.125},
            "online": {"refresh_every": 1, "kl_coef": 0.05},
            "generate": {"include_dataset_responses": None},
            "judge": {"preferences": "hard"},
        },
    },
}


def recipe(method: str, model: Path, work: Path, args: argparse.Namespace) -> dict:
    spec = METHOD[method]
    pofe = {
        "generate": {
            "backend": "transformers",
            "num_candidates": 4,
            "temperature": 1.0,
            "max_new_tokens": 24,
            "include_dataset_responses": ["answer"],
        },
        "judge": {"type": "python", "function": "pofe.demo.real_task:reward"},
    }
    for key, value in spec["pofe"].items():
        pofe[key] = {**pofe.get(key, {}), **value} if isinstance(value, dict) else value
    pofe["generate"] = {k: v for k, v in pofe["generate"].items() if v is not None}
    return {
        "base_model": str(model),
        "plugins": ["pofe.PofePlugin"],
        "rl": spec["rl"],
        "datasets": [{"path": str(work / "prompts.jsonl"), "type": "pofe.prompts"}],
        "pofe": pofe,
        "dataset_prepared_path": str(work / "prepared"),
        "output_dir": str(work / "out"),
        "adapter": "lora",
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "lora_target_linear": True,
        "sequence_len": 160,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "num_epochs": args.epochs,
        "learning_rate": args.lr,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "logging_steps": 4,
        "save_strategy": "no",
        "seed": args.seed,
        **CPU,
    }


def axolotl(*args: str, log: Path) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    extra = ["--launcher", "python"] if args[0] == "train" else []
    start = time.time()
    with open(log, "a") as f:
        subprocess.run(
            [str(Path(sys.executable).parent / "axolotl"), *args, *extra], env=env, stdout=f, stderr=f, check=True
        )
    return time.time() - start


def greedy_scores(model: Path, prompts: list[str]) -> list[float]:
    """The verifier's score of each greedy answer (up to 32 new tokens), float32 on the CPU."""
    policy = load_policy(str(model), device="cpu", dtype=torch.float32)
    tokenizer = load_tokenizer(str(model))
    rendered = [render_prompt(tokenizer, p).text for p in prompts]
    answers = sample_responses(
        policy, tokenizer, rendered, 1, Sampling(temperature=0.0, max_new_tokens=32), batch_size=25
    )
    texts = [tokenizer.decode(s.response_ids, skip_special_tokens=True) for (s,) in answers]
    return [real_task.reward(p, t) for p, t in zip(prompts, texts)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=sorted(METHOD), default="rrhf")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=96, help="training prompts")
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--model", type=Path, default=ROOT / ".real-model" / "SmolLM2-135M-Instruct")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    model = smollm2.prepare(args.model)
    work = args.work or Path(tempfile.mkdtemp(prefix=f"real-{args.method}-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = real_task.make_prompt_rows(args.train, seed=args.seed)
    held = [r["prompt"] for r in real_task.make_prompt_rows(args.held_out, seed=args.seed, skip=args.train)]
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = work / "recipe.yml"
    cfg.write_text(yaml.safe_dump(recipe(args.method, model, work, args)))
    seconds = {"preprocess": axolotl("preprocess", str(cfg), log=work / "log.txt")}
    seconds["train"] = axolotl("train", str(cfg), log=work / "log.txt")
    before = torch.tensor(greedy_scores(model, held))
    after = torch.tensor(greedy_scores(work / "out", held))
    draws = prompt_resamples(len(held), 1000, seed=0)
    low, high = percentile_interval((after - before)[draws].mean(dim=1))
    result = {
        "method": args.method,
        "seed": args.seed,
        "train_prompts": args.train,
        "held_out": len(held),
        "before": before.mean().item(),
        "after": after.mean().item(),
        "gain": (after - before).mean().item(),
        "gain_95": [low.item(), high.item()],
        "seconds": seconds,
        "work": str(work),
    }
    out = ROOT / "benchmarks" / "results" / f"real-model-{args.method}-seed{args.seed}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
