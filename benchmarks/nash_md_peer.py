"""Nash-MD on the toy: POFE's shipped recipe against TRL's NashMDTrainer, greedy exact match per seed.

    python -m benchmarks.nash_md_peer                           # seeds 0, 1, 2: both arms (~25 min on 2 cores)
    python -m benchmarks.nash_md_peer --seeds 0 --refresh-every 3   # the recipe with another refresh_every
    python -m benchmarks.nash_md_peer --arms pofe trl trl-sequence-kl

For each seed s (the toy's, as `python -m pofe.demo --seed s` takes it: the tiny random Llama's
weights and the 60 addition prompts; training keeps the recipe's `seed: 0`), in a scratch folder:

pofe             `python -m pofe.demo --recipe recipes/tiny-nash-md-online-cpu.yml --seed s`: the real
                 `axolotl train` of recipes/tiny-sft-cpu.yml (pi_0: a supervised fine-tune on the
                 answers), then of the Nash-MD recipe from it, each a process of its own
trl              TRL's NashMDTrainer (`trl.experimental.nash_md`, TRL 1.9.0, axolotl 0.19's pin) from
                 that same pi_0 folder, as policy and reference, on the same 60 prompts rendered by
                 the same chat template (no BOS added: POFE renders them so), with the recipe's
                 settings: mixture_coef (beta), kl_coef (TRL's beta, tau), num_candidates samples
                 per prompt (each prompt's row repeated num_candidates times: TRL samples one
                 completion per row), micro_batch_size prompts a step, num_epochs, learning rate,
                 schedule and warm-up, temperature, max_new_tokens, the training seed. TRL samples
                 at every step (POFE's refresh_every: 1). The judge is the recipe's
                 (`pofe.demo.task:exact_reward` on the completion decoded without its special
                 tokens, as POFE decodes it for a judge) with its `preferences: hard`: TRL's
                 P = sigmoid(r - r') is given r scaled by 1e4, which makes it 1, 1/2 or 0 exactly
trl-sequence-kl  the same, with POFE's KL estimator in TRL's loss: the whole sequence's log-ratio to
                 pi_0 times grad log pi(y) (`pofe.losses.nash_md_loss`), where TRL multiplies each
                 token's log-ratio by that token's log-prob only

What differs still: TRL's batches are 320 rows drawn at random from the 960 repeated ones, where
POFE's step takes 20 prompts with 16 samples each (both estimators are unbiased either way); TRL
samples the mixture without a KV cache (slower, the same distribution).

Reported per seed: each arm's greedy exact match on the 60 training prompts (the demo table's
"greedy exact match, training prompts": `pofe.demo.stages.greedy`, one thread) beside pi_0's, and the
arm's wall seconds (pofe's: the whole demo, pi_0's fine-tune included); for pofe also its samples'
mean reward at the first and the last refresh. JSON: benchmarks/results/nash-md-peer-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.trainers import environment

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "tiny-nash-md-online-cpu.yml"
RESULTS = ROOT / "benchmarks" / "results" / "nash-md-peer-cpu.json"
ARMS = ("pofe", "trl", "trl-sequence-kl")
# TRL's preference is sigmoid(r - r'): rewards of 0 and 1 scaled by this give exactly 1, 1/2 or 0
HARD = 1e4


def pofe_arm(folder: Path, recipe: Path, seed: int) -> dict:
    """The demo's run of the recipe (pi_0 fine-tuned first) in `folder`: pi_0's and the trained
    model's greedy figures on the training prompts, from demo-results.json."""
    cfg = yaml.safe_load(recipe.read_text())
    start = time.perf_counter()
    command = [sys.executable, "-m", "pofe.demo", "--recipe", str(recipe), "--seed", str(seed)]
    proc = subprocess.run(command, cwd=folder, env=environment(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    seconds = time.perf_counter() - start
    results = json.loads((folder / Path(cfg["datasets"][0]["path"]).parent / "demo-results.json").read_text())
    sft, nash_md = results["runs"]
    return {
        "pi_0": sft["after"]["train"]["exact_match"],
        "exact_match": nash_md["after"]["train"]["exact_match"],
        # the policy's samples' mean reward (exact matches) at the first and the last refresh
        "samples_reward": [nash_md["refreshes"][i]["candidate_reward_mean"] for i in (0, -1)],
        "seconds": seconds,
        "train_seconds": nash_md["seconds"]["train"],
    }


def trl_trainer(sequence_kl: bool):
    """TRL's NashMDTrainer judged by the toy's verifier, prompts tokenised as POFE's (no BOS), and
    with POFE's sequence-level KL estimator if `sequence_kl`."""
    import torch
    from trl.experimental.nash_md import NashMDTrainer

    from pofe.demo.task import exact_reward

    class Trainer(NashMDTrainer):
        @staticmethod
        def tokenize_row(feature, is_encoder_decoder, tokenizer):
            batch = tokenizer(feature["prompt"], add_special_tokens=False)
            return {f"prompt_{key}": value for key, value in batch.items()}

        def _compute_rewards(self, model_data, mixture_data, context_length):
            tokenizer = self.processing_class

            def scores(data):
                completions = tokenizer.batch_decode(data["input_ids"][:, context_length:], skip_special_tokens=True)
                rewards = [exact_reward(p[0]["content"], c) for p, c in zip(data["raw"], completions, strict=True)]
                return torch.tensor(rewards, device=data["input_ids"].device) * HARD

            return scores(model_data), scores(mixture_data)

        def _compute_losses(self, model_logprobs, ref_logprobs, probability):
            if not sequence_kl:
                return super()._compute_losses(model_logprobs, ref_logprobs, probability)
            logps = model_logprobs.sum(1)
            score = (probability - 0.5) * logps
            with torch.no_grad():
                kl = (model_logprobs - ref_logprobs).sum(1)
            return (self.beta * kl * logps - score).mean(), score, kl

    return Trainer


def trl_arm(folder: Path, recipe: Path, sequence_kl: bool) -> dict:
    """TRL's NashMDTrainer from the pofe arm's pi_0 on its prompts, with the recipe's settings."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.nash_md import NashMDConfig

    from pofe.demo.stages import greedy
    from pofe.files import read_jsonl

    cfg = yaml.safe_load(recipe.read_text())
    pofe, generate = cfg["pofe"], cfg["pofe"]["generate"]
    pi_0 = folder / cfg["base_model"]
    prompts = [row["prompt"] for row in read_jsonl(folder / cfg["datasets"][0]["path"])]
    k = generate["num_candidates"]
    out = folder / "outputs" / ("trl-sequence-kl" if sequence_kl else "trl")
    args = NashMDConfig(
        output_dir=str(out),
        per_device_train_batch_size=cfg["micro_batch_size"] * k,
        gradient_accumulation_steps=cfg["gradient_accumulation_steps"],
        num_train_epochs=cfg["num_epochs"],
        learning_rate=cfg["learning_rate"],
        lr_scheduler_type=cfg["lr_scheduler"],
        warmup_steps=cfg["warmup_steps"],
        optim=cfg["optimizer"],
        seed=cfg["seed"],
        mixture_coef=[pofe["nash_md"]["mixture_coef"]],
        beta=[pofe["online"]["kl_coef"]],
        temperature=generate["temperature"],
        max_new_tokens=generate["max_new_tokens"],
        missing_eos_penalty=None,
        logging_steps=cfg["logging_steps"],
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
    )
    torch.set_num_threads(1)  # as the demo's stages train (pofe.demo.stages.ENV)
    model, ref = (AutoModelForCausalLM.from_pretrained(pi_0, dtype=torch.float32) for _ in range(2))
    tokenizer = AutoTokenizer.from_pretrained(pi_0)
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in prompts for _ in range(k)]
    start = time.perf_counter()
    trainer = trl_trainer(sequence_kl)(
        model=model,
        ref_model=ref,
        reward_funcs=lambda **_: [],  # never called: _compute_rewards judges
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    return {"exact_match": greedy(out, {"train": prompts})["train"]["exact_match"], "seconds": seconds}


def run_seed(seed: int, arms: list[str], refresh_every: int | None) -> dict:
    """Every arm on the toy of `seed`, in a scratch folder: pofe first (it trains pi_0)."""
    folder = Path(tempfile.mkdtemp(prefix="pofe-nash-md-peer-"))
    recipe = folder / RECIPE
    cfg = yaml.safe_load((ROOT / "recipes" / RECIPE).read_text())
    if refresh_every is not None:
        cfg["pofe"]["online"]["refresh_every"] = refresh_every
    recipe.write_text(yaml.safe_dump(cfg, sort_keys=False))
    found = {"seed": seed, "refresh_every": cfg["pofe"]["online"]["refresh_every"]}
    found["pofe"] = pofe_arm(folder, recipe, seed)
    for arm in arms:
        if arm != "pofe":
            found[arm] = trl_arm(folder, recipe, sequence_kl=arm == "trl-sequence-kl")
    shutil.rmtree(folder)
    print(json.dumps(found), flush=True)
    return found


def table(runs: list[dict], arms: list[str]) -> list[str]:
    """Per seed: pi_0's greedy exact match and each arm's."""
    lines = [f"| seed | pi_0 | {' | '.join(arms)} |", "|---" * (len(arms) + 2) + "|"]
    for run in runs:
        cells = " | ".join(f"{run[a]['exact_match']:.3f} ({run[a]['seconds']:.0f} s)" for a in arms)
        lines.append(f"| {run['seed']} | {run['pofe']['pi_0']:.3f} | {cells} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nash_md_peer", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=["pofe", "trl"])
    parser.add_argument(
        "--refresh-every", type=int, default=None, help="The recipe's pofe.online.refresh_every replaced."
    )
    args = parser.parse_args()
    arms = ["pofe", *(a for a in args.arms if a != "pofe")]  # pofe trains the pi_0 the others start from
    runs = [run_seed(seed, arms, args.refresh_every) for seed in args.seeds]
    print("\n".join(table(runs, arms)))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"arms": arms, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
