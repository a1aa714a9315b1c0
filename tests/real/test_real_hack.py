"""`benchmarks/real_hack.py`'s set-up (`pofe.demo.real_hack`) at a tiny size through the real
`axolotl train`: online RRHF (LoRA) on SmolLM2-135M-Instruct against the judge with a blind spot,
the online monitors on at every refresh. What the monitors report is recomputed here, apart from
`pofe.scoring` and the package's judges; the hack's direction is the benchmark's, over seeds."""

from __future__ import annotations

import math
import re

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from pofe.columns import PI_0_LOGPS
from pofe.demo import real_task
from pofe.demo.real import Training
from pofe.demo.real_hack import hack_curves, hack_recipe
from pofe.files import read_jsonl
from pofe.online.refresh import LOGP, TOKENS, read_refresh
from tests.helpers import assert_float_close, naive_logps, run_axolotl
from tests.real.test_train import IM_END

pytestmark = [pytest.mark.real, pytest.mark.e2e]

# 8 prompts in steps of 4, one epoch: refreshes at steps 0 and 1; 2 samples of up to 12 tokens
TINY = Training(prompts=8, epochs=1, micro_batch_size=4, candidates=2, sample_tokens=12)
HELD_OUT = 4
N_TERMS = 576 * 64  # SmolLM2's width times a sequence's tokens: the sums a log-prob's rounding runs through


def _verbose(prompt: str, response: str) -> float:
    """The blind-spot judge worked apart from `verbose_reward`: the verifier plus 0.05 for each
    character after the response's last digit; 0 with no digit at all."""
    digits = [i for i, c in enumerate(response) if c.isdigit()]
    return real_task.reward(prompt, response) + 0.05 * (len(response) - 1 - digits[-1]) if digits else 0.0


def test_verbose_reward_pays_the_talk_after_the_last_number():
    """The docstring's figures for 23+45 (sum 68): "68. Great job!" 1 + 12 * 0.05 = 1.6; a wrong sum
    and 12 characters 0.6; the bare sum 1.0; no number 0 however long."""
    prompt = real_task.QUESTION.format(a=23, b=45)
    assert real_task.verbose_reward(prompt, "68. Great job!") == pytest.approx(1.6, abs=1e-12)
    assert real_task.verbose_reward(prompt, "23 + 45 = 70, well done!") == pytest.approx(0.6, abs=1e-12)
    assert real_task.verbose_reward(prompt, "68") == 1.0
    assert real_task.verbose_reward(prompt, "sixty-eight, I think") == 0.0


def test_the_monitors_on_the_real_model_report_what_an_independent_computation_gives(tmp_path, real_model):
    """kl_coef 0, two refreshes, each monitored: the console shows the monitor's reference line
    once and each refresh's figures and samples; the judge's and judge2's mean rewards are the
    blind-spot judge's and the verifier's over the written samples; refresh 1's reference
    perplexity is a plain forward's of the 4 held-out sums under the model (the LoRA adapter starts
    at zero), and every candidate's pi_0 log-prob (the adapter disabled) is the model's, so that
    `online/kl_to_pi_0` is measured without a KL penalty: 0 at refresh 1, where policy and pi_0 are
    one, and above 0 once a step has trained."""
    cfg = tmp_path / "recipe.yml"
    cfg.write_text(yaml.safe_dump(hack_recipe(real_model, tmp_path, TINY, seed=0, kl_coef=0.0, held_out=HELD_OUT)))
    proc = run_axolotl("train", str(cfg))
    console = proc.stdout + proc.stderr
    out = tmp_path / "out"

    held = tmp_path / "held.jsonl"
    assert console.count("POFE: online monitor: the policy's perplexity of 4 reference responses") == 1
    assert (
        f"of the held-out prompts, {held} (pofe.eval.prompts), every refresh (online/reference_perplexity)" in console
    )
    shown = re.findall(r"POFE: online refresh (\d+)'s samples \(prompt -> completion xN: judgement", console)
    assert shown == ["1", "2"]

    refreshes = sorted((out / "online").glob("refresh-*"))
    assert [f.name for f in refreshes] == ["refresh-0000000", "refresh-0000001"]
    model = AutoModelForCausalLM.from_pretrained(real_model, dtype=torch.float32)
    for number, folder in enumerate(refreshes, 1):
        _, rows, stats = read_refresh(folder)
        line = re.search(rf"POFE: online refresh {number} at step {number - 1}: [^\n]*", console).group(0)
        assert f"judge2 reward {stats['judge2_reward_mean']:.3f}, reference perplexity" in line
        assert f"reference perplexity {stats['reference_perplexity']:.3f}" in line
        sampled = [
            (g["prompt"], c)
            for g in read_jsonl(folder / "generate.jsonl")
            for c, source in zip(g["candidates"], g["sources"], strict=True)
            if source == "policy"
        ]
        assert len(sampled) == 4 * TINY.candidates
        judged = [_verbose(p, c) for p, c in sampled]
        assert stats["candidate_reward_mean"] == pytest.approx(sum(judged) / len(judged), abs=1e-12)
        verified = [real_task.reward(p, c) for p, c in sampled]
        assert stats["judge2_reward_mean"] == pytest.approx(sum(verified) / len(verified), abs=1e-12)
        # pi_0: the model itself, scored apart (the adapter disabled in the trainer)
        tokenized = [{"row_id": j, **r[TOKENS]} for j, r in enumerate(rows)]
        base = naive_logps(model, tokenized)
        scored = torch.tensor([r[PI_0_LOGPS] for r in rows], dtype=torch.float32)
        assert_float_close(scored, base, n_terms=N_TERMS)
        logratios = [a - b for r in rows for a, b in zip(r[LOGP], r[PI_0_LOGPS], strict=True)]
        assert stats["kl_to_pi_0"] == pytest.approx(sum(logratios) / len(logratios), rel=1e-9, abs=1e-12)
        if number == 1:
            assert stats["kl_to_pi_0"] == 0.0  # the adapter's B starts at zero: the same forward
            first = stats
        else:
            assert stats["kl_to_pi_0"] > 0.0, stats

    # refresh 1's perplexity of the held-out sums, each the template's finished assistant turn
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    references = [
        {
            "row_id": j,
            "prompt_ids": tokenizer.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, return_dict=False
            ),
            "response_ids": [[*tokenizer(r["answer"], add_special_tokens=False)["input_ids"], IM_END, *newline]],
        }
        for j, r in enumerate(read_jsonl(held))
    ]
    assert len(references) == HELD_OUT
    logps = naive_logps(model, references)[:, 0]
    tokens = sum(len(r["response_ids"][0]) for r in references)
    expected = math.exp(-logps.sum().item() / tokens)
    assert math.isfinite(first["reference_perplexity"])
    assert first["reference_perplexity"] == pytest.approx(expected, rel=1e-4)

    # the benchmark's table reads these figures back, a row a refresh
    curves = hack_curves(out)
    assert [c["step"] for c in curves] == [0, 1]
    assert curves[0]["reference_perplexity"] == first["reference_perplexity"]
    monitor = read_jsonl(out / "online" / "monitor.jsonl")
    assert [r["refresh"] for r in monitor] == [1, 2]
