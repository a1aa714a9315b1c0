"""`pofe.anchor_mix` in a real `axolotl train`: SPPO's anchor mixed toward pi_0.

At step 1 the policy is pi_t itself, so the logged mean log-ratio to the mixed anchor is
exactly beta * mean(log pi_t - log pi_0) over the candidates, which a plain forward of each
response under both models gives independently (`tests.helpers.naive_logps`). With the plain
anchor it is 0 (`tests/test_e2e_train.py`).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from pofe.demo.task import make_sppo_rows, write_jsonl
from pofe.demo.tiny import build_tiny_model
from tests.helpers import float_tolerance, log_history, naive_logps, prepared_rows, recipe, run_axolotl

pytestmark = pytest.mark.e2e

BETA = 0.5
ROWS = 8  # one batch of 8: step 1 sees every row
HIDDEN = 128  # tiny_model's width


def _expected_logratio(rows, policy, pi_0) -> tuple[float, float]:
    """(beta * mean over real candidates of log pi_t - log pi_0, its float32 tolerance)."""
    diff = naive_logps(policy, rows) - naive_logps(pi_0, rows)  # (rows, K_max), NaN in padding
    real = diff.isfinite()
    tokens = max(len(r["prompt_ids"]) + sum(map(len, r["response_ids"])) for r in rows)
    magnitude = naive_logps(pi_0, rows)[real].abs().max().item()
    return BETA * diff[real].mean().item(), float_tolerance(torch.float32, HIDDEN * tokens, magnitude)["atol"]


def _train(tmp_path, model, data, **extra):
    pofe = {"eta": 10.0, "anchor_mix": BETA, **extra.pop("pofe", {})}
    cfg = recipe(tmp_path, model, "sppo", data, "pofe.sppo", pofe=pofe, micro_batch_size=ROWS, max_steps=1, **extra)
    proc = run_axolotl("train", str(cfg))
    (step,) = [h for h in log_history(tmp_path / "out") if "loss" in h]
    return proc, step


def test_pi_0_loaded_apart_enters_the_anchor(tmp_path, tiny_model):
    """pi_0 names another model (an SFT model, or an iterated run's first policy): its
    table is computed as the rows load, cached as pofe-pi0-*.pt, and step 1's log-ratio is
    beta * mean(log pi_t - log pi_0) (0 without anchor_mix: the test asks 100 tolerances off it)."""
    sft = build_tiny_model(tmp_path / "sft", seed=1)
    data = write_jsonl(make_sppo_rows(ROWS, k=4, seed=0), tmp_path / "sppo.jsonl")
    proc, step = _train(tmp_path, tiny_model, data, pofe={"pi_0": str(sft)}, learning_rate=1e-3)
    assert len(list((tmp_path / "prepared").glob("pofe-pi0-*.pt"))) == 1
    assert f"POFE: loading pi_0 ({sft})" in proc.stdout
    rows = prepared_rows(tmp_path / "prepared")
    load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # noqa: E731
    expected, tol = _expected_logratio(rows, load(tiny_model), load(sft))
    assert abs(expected) > 100 * tol  # the models differ: a plain anchor (0) would fail
    assert step["sppo/logratio"] == pytest.approx(expected, abs=tol)


def test_pi_0_is_the_policy_with_its_adapter_disabled(tmp_path, tiny_model):
    """The policy is a LoRA adapter (lora_model_dir, non-zero B) on base_model = pi_0: pi_0's
    log-probs come from the policy with its adapter disabled, no model loaded apart, and step
    1's log-ratio is beta * mean(log pi_adapter - log pi_0)."""
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(tmp_path / "adapter")
    data = write_jsonl(make_sppo_rows(ROWS, k=4, seed=0), tmp_path / "sppo.jsonl")
    lora_keys = {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_target_linear": True}
    proc, step = _train(
        tmp_path, tiny_model, data, lora_model_dir=str(tmp_path / "adapter"), learning_rate=1e-3, **lora_keys
    )
    assert "POFE: loading pi_0" not in proc.stdout
    assert "computed pi_0 (the policy without its adapter) log-probs" in proc.stdout
    assert len(list((tmp_path / "prepared").glob("pofe-pi0-*.pt"))) == 1
    from peft import PeftModel

    rows = prepared_rows(tmp_path / "prepared")
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), tmp_path / "adapter"
    ).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    expected, tol = _expected_logratio(rows, adapted, base)
    assert abs(expected) > 100 * tol
    assert step["sppo/logratio"] == pytest.approx(expected, abs=tol)
