"""`make demo`'s real-model part (`python -m pofe.demo --real --method rrhf`, `pofe.demo.real`) at a tiny
size: SmolLM2-135M-Instruct trained with LoRA by RRHF through the real `axolotl preprocess` and
`axolotl train`, its held-out answers before and after, and the table of the gain with its interval.
One method keeps the test near 2 minutes on 2 cores (each `axolotl` process starts in ~20 s); SPPO's
and Nash-MD's recipes run in the same stages (`benchmarks.real_model`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from pofe.demo import real_task
from pofe.demo.real import TRAINING, real_table
from pofe.run.evaluation.statistics import percentile_interval, prompt_resamples
from tests.doc_blocks import shell_block
from tests.helpers import AXOLOTL_ENV, ROOT

pytestmark = [pytest.mark.real, pytest.mark.e2e]

TRAIN, HELD_OUT = 8, 6


def plain_greedy(model: Path, prompts: list[str], new_tokens: int) -> list[str]:
    """Each prompt's greedy answer from a plain `generate`, one prompt at a time (no padding), float32."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=False
        )
        new = policy.generate(ids, do_sample=False, max_new_tokens=new_tokens)[0, ids.shape[1] :]
        out.append(tokenizer.decode(new, skip_special_tokens=True))
    return out


def demo_real_args() -> list[str]:
    """The Makefile's DEMO_REAL: what `make demo` passes to `python -m pofe.demo` after the toy."""
    (line,) = [x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("DEMO_REAL ?=")]
    return line.split("?=")[1].split()


def test_make_demos_real_part_trains_rrhf_and_prints_its_gain(tmp_path, real_model):
    """`make demo`'s `python -m pofe.demo --real --method rrhf`, on the converted model the suite shares
    (`--real FOLDER`), with 8 training prompts (one step of 8 an epoch, 2 epochs) and 6 held-out ones,
    past every method's default training prompts. The adapter moved from its zero start; the answers
    before are a plain greedy `generate` of the model; the scores are the verifier's; the gain is
    after - before, its interval the paired bootstrap's quantiles over the held-out prompts; the
    console ends with the table of those numbers."""
    args = demo_real_args()
    assert args == ["--real", "--method", "rrhf"]
    # the README's command, which trains every method: make demo's names one
    assert shell_block("README.md", "python -m pofe.demo --real").text.split("#")[0].split() == [
        "python",
        "-m",
        "pofe.demo",
        "--real",
    ]
    args = [
        "-m",
        "pofe.demo",
        args[0],
        str(real_model),
        *args[1:],
        "--prompts",
        str(TRAIN),
        "--held-out",
        str(HELD_OUT),
    ]
    env = {**os.environ, **AXOLOTL_ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / "outputs" / "demo-real"
    results = json.loads((folder / "real-results.json").read_text())
    assert proc.stdout.rstrip().endswith("\n".join(real_table(results)))
    assert [r["method"] for r in results["runs"]] == ["rrhf"]

    # after every method's training prompts at their default size, whatever --prompts says
    skip = max(t.prompts for t in TRAINING.values())
    held = [r["prompt"] for r in real_task.make_prompt_rows(HELD_OUT, seed=0, skip=skip)]
    before = results["runs"][0]["answers"]["before"]
    assert [a["prompt"] for a in before] == held
    assert [a["answer"] for a in before] == plain_greedy(real_model, held, results["answers"]["tokens"])
    for run in results["runs"]:
        assert run["answers"]["before"] == before  # pi_0 answered once
        trained = [
            json.loads(line)["prompt"] for line in (folder / run["method"].replace("_", "-") / "prompts.jsonl").open()
        ]
        assert trained == [r["prompt"] for r in real_task.make_prompt_rows(TRAIN, seed=0)] and run["prompts"] == TRAIN
        after = run["answers"]["after"]
        for a in before + after:
            assert a["score"] == real_task.reward(a["prompt"], a["answer"])
        b = torch.tensor([a["score"] for a in before], dtype=torch.float64)
        f = torch.tensor([a["score"] for a in after], dtype=torch.float64)
        assert (run["before"], run["after"], run["gain"]) == (b.mean().item(), f.mean().item(), (f - b).mean().item())
        low, high = percentile_interval((f - b)[prompt_resamples(HELD_OUT, 1000, 0)].mean(dim=1))
        assert run["gain_95"] == [low.item(), high.item()]
        # LoRA's B matrices start at zero: each moved in training
        adapter = load_file(folder / run["method"].replace("_", "-") / "out" / "adapter_model.safetensors")
        b_matrices = [t for name, t in adapter.items() if "lora_B" in name]
        assert b_matrices and all(t.abs().sum() > 0 for t in b_matrices)
    logs = sorted(p.name for p in (folder / "logs").glob("*.log"))
    assert logs == sorted(
        ["demo.log", "real-prepare.log", "real-rrhf-preprocess.log", "real-rrhf-train.log", "real-rrhf-evaluate.log"]
    )
