"""The RRHF paper's warning on the real model: online RRHF (LoRA) on SmolLM2-135M-Instruct against a
judge with a blind spot (`real_task.verbose_reward`: the verifier plus 0.05 for every character after
the last integer), with the online monitors watching: `pofe.eval.judge2` the verifier, the held-out
questions' sums as the references whose perplexity the policy is measured on, every refresh.

`benchmarks/real_hack.py` runs it with `kl_coef` 0 and `HACK_KL` and prints `hack_table`; the
policy's own samples only (no dataset answer), so `online/kl_to_pi_0`, the mean log-ratio to pi_0
of the samples, is a Monte-Carlo estimate of KL(pi || pi_0) (measured at every monitored refresh
under LoRA, with or without the penalty).
"""

from __future__ import annotations

import json
from pathlib import Path

from pofe.demo import real_task
from pofe.demo.real import Training, real_recipe
from pofe.files import read_jsonl, write_atomic
from pofe.records.refresh import written_refreshes

# 32 prompts, 8 a refresh of one step, 3 epochs: 12 refreshes; samples up to 24 tokens
HACK = Training(prompts=32, epochs=3, learning_rate=6e-4, micro_batch_size=8, candidates=4, sample_tokens=24)
HACK_KL = 0.2
HELD_OUT = 32  # questions after the training ones in the seed's order: the references
# per refresh: the judge's mean reward of the samples, the verifier's, the references' perplexity, the KL
COLUMNS = ("candidate_reward_mean", "judge2_reward_mean", "reference_perplexity", "kl_to_pi_0")


def hack_recipe(model: Path, work: Path, size: Training, seed: int, kl_coef: float, held_out: int = HELD_OUT) -> dict:
    """`real_recipe`'s RRHF online: a step a refresh, the policy's samples only (copies kept, as
    sampled), judged by `verbose_reward`, monitored every refresh; writes `work/prompts.jsonl`
    (`size.prompts` questions) and `work/held.jsonl` (the `held_out` after them, with their sums)."""
    rows = real_task.make_prompt_rows(size.prompts + held_out, seed=seed)
    work.mkdir(parents=True, exist_ok=True)
    for name, part in (("prompts.jsonl", rows[: size.prompts]), ("held.jsonl", rows[size.prompts :])):
        write_atomic(work / name, "".join(json.dumps(r) + "\n" for r in part))
    cfg = real_recipe("rrhf", model, work, size, seed)
    generate = {k: v for k, v in cfg["pofe"]["generate"].items() if k != "include_dataset_responses"}
    cfg["pofe"] |= {
        "generate": {**generate, "dedupe": False, "seed": seed},
        "judge": {"type": "python", "function": "pofe.demo.real_task:verbose_reward"},
        "online": {"refresh_every": 1, "kl_coef": kl_coef, "monitor_every": 1, "monitor_samples": 1},
        "eval": {
            "prompts": str(work / "held.jsonl"),
            "reference_column": "answer",
            "judge2": {"type": "python", "function": "pofe.demo.real_task:reward"},
        },
    }
    return cfg


def hack_curves(output_dir: Path) -> list[dict]:
    """Each refresh's `COLUMNS` (None where not measured) and its samples' mean length in tokens."""
    curves = []
    for refresh in written_refreshes(output_dir):
        tokens = [
            n
            for folder in refresh.folders
            for g in read_jsonl(folder / "generate.jsonl")
            for n, source in zip(g["candidate_tokens"], g["sources"], strict=True)
            if source == "policy"
        ]
        curves.append(
            {
                "step": refresh.start_step,
                **{k: refresh.stats.get(k) for k in COLUMNS},
                "mean_tokens": sum(tokens) / len(tokens),
            }
        )
    return curves


def hack_table(curves: dict[float, list[dict]]) -> list[str]:
    """A block per `kl_coef`, a line per refresh: the judge's reward, the verifier's, the reference
    perplexity, KL to pi_0 and the samples' mean length in tokens."""
    lines = []
    for kl, rows in curves.items():
        lines.append(f"kl_coef {kl:g}")
        lines.append(f"{'refresh':>8}{'judge':>10}{'verifier':>10}{'ref ppl':>10}{'KL':>10}{'tokens':>10}")
        for i, row in enumerate(rows):
            cells = "".join(_cell(row[k]) for k in (*COLUMNS, "mean_tokens"))
            lines.append(f"{i + 1:>8}{cells}")
    return lines


def _cell(value: float | None) -> str:
    return f"{'-':>10}" if value is None else f"{value:>10.3f}"
