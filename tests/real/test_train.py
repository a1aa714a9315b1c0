"""SmolLM2-135M-Instruct trained by `axolotl train` with POFE on the CPU: its ChatML template's
tokens as POFE trains them, and RRHF with LoRA and QLoRA moving its real weights.

Rows: two-digit additions asked in natural language, the sum against a near miss and a wrong
sentence; the model answers about one in five right greedily, so each row has a real best answer.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from pofe.data.tokenize import tokenize_row
from tests.helpers import log_history, recipe, run_axolotl

pytestmark = pytest.mark.real

IM_END = 2  # <|im_end|>, SmolLM2's end of turn and EOS (tests/real/test_prepare.py)


def addition_rows(n: int, seed: int = 0) -> list[dict]:
    """RRHF rows: "What is a+b? ..." with the sum (reward 1), the sum plus one (0.5), and a
    sentence with a wrong sum (0)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append(
            {
                "prompt": f"What is {a}+{b}? Answer with the number only.",
                "responses": [str(a + b), str(a + b + 1), f"{a} + {b} = {a + b - 10}"],
                "rewards": [1.0, 0.5, 0.0],
            }
        )
    return rows


def test_trained_tokens_are_the_templates_conversation(real_model):
    """The prompt POFE trains on is the template's generation prompt, and each response's tokens
    are what the template writes for that assistant turn: the content, then `<|im_end|>` (the token
    generation stops at, the model's EOS) and the newline ChatML writes after it, scored as the
    template writes a finished turn (`pofe_candidates.token_ids`)."""
    tokenizer = AutoTokenizer.from_pretrained(real_model)
    row = addition_rows(1)[0]
    messages = [{"role": "user", "content": row["prompt"]}]
    canonical = {"prompt": messages, "responses": [{"role": "assistant", "content": r} for r in row["responses"]]}
    out = tokenize_row(canonical, tokenizer, sequence_len=256, max_prompt_len=128, truncation="truncate")
    generation_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert out["prompt_ids"] == generation_prompt
    assert out["eos_appended"] == 0
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    for response, ids in zip(row["responses"], out["response_ids"]):
        conversation = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": response}], return_dict=False
        )
        assert conversation == generation_prompt + ids
        assert ids[-1 - len(newline) :] == [IM_END, *newline] and ids.count(IM_END) == 1
        assert tokenizer.decode(ids[: -1 - len(newline)]) == response


LORA = {
    "adapter": "lora",
    "lora_r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "lora_target_modules": ["q_proj", "v_proj", "o_proj"],
    "learning_rate": 1e-3,
}


@pytest.mark.e2e
@pytest.mark.parametrize("adapter", ["lora", "qlora"])
def test_rrhf_adapter_trains_every_layer(tmp_path, real_model, adapter):
    """RRHF with LoRA, and with QLoRA (4-bit NF4 base, bitsandbytes' CPU backend), through the
    real `axolotl train` on the real model: the logged loss is RRHF's, and every adapter matrix of
    all 30 layers moved from LoRA's zero start (a 4-bit base that carried no gradient would leave
    those before it at zero: docs on the AVX512-BF16 trap in shared/environment.md)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in addition_rows(8)))
    extra = LORA if adapter == "lora" else {**LORA, "adapter": "qlora", "load_in_4bit": True}
    cfg = recipe(tmp_path, real_model, "rrhf", data, "pofe.rrhf", sequence_len=128, **extra)
    run_axolotl("train", str(cfg))

    history = [h for h in log_history(tmp_path / "out") if "loss" in h]
    assert len(history) == 2  # 8 rows / micro-batch 4, one epoch
    for h in history:
        assert h["loss"] == pytest.approx(h["rrhf/rank"] + h["rrhf/ft"], rel=2e-3)
    weights = load_file(tmp_path / "out" / "adapter_model.safetensors")
    lora_b = {k: w for k, w in weights.items() if "lora_B" in k}
    assert len(lora_b) == 30 * 3
    still_zero = sorted(k for k, w in lora_b.items() if torch.count_nonzero(w) == 0)
    assert not still_zero, still_zero
