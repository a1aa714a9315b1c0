"""SmolLM2-135M-Instruct trained online by `axolotl train` (RRHF, LoRA) and evaluated by `axolotl
pofe eval`: the refresh's samples are the model's own answers as the template writes a finished
turn (ending at `<|im_end|>`), and the evaluation reads and scores the real models' answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from pofe.demo import real_task
from pofe.online.refresh import TOKENS, read_refresh
from pofe.run.folder import RunFolder
from tests.helpers import checked_eval_samples, recipe, run_axolotl
from tests.real.test_train import IM_END, LORA

pytestmark = [pytest.mark.real, pytest.mark.e2e]

JUDGE = {"type": "python", "function": "pofe.demo.real_task:reward"}
NEW_TOKENS = 24


def greedy_answers(model: Path, tokenizer, prompts: list[str]) -> list[str]:
    """Each prompt's greedy answer from a plain `generate` of `model` (a model's folder, or a LoRA
    adapter's, which peft loads over the base it names), one prompt at a time, float32."""
    auto = AutoPeftModelForCausalLM if (model / "adapter_config.json").exists() else AutoModelForCausalLM
    policy = auto.from_pretrained(model, dtype=torch.float32)
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt", return_dict=False
        )
        new = policy.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS)[0, ids.shape[1] :]
        out.append(tokenizer.decode(new, skip_special_tokens=True))
    return out


def test_online_refresh_samples_end_turns_and_eval_reads_real_answers(tmp_path, real_model):
    """12 prompts, the last 4 held out: one refresh samples 4 answers for each of the 8 others
    (one epoch, 2 steps), then `pofe eval` has the base and the trained adapter answer the 4
    greedily. Each sample is written with the ids it was sampled as, less the `<|im_end|>` it
    stopped at, and trained as the template's finished turn (those ids, `<|im_end|>`, ChatML's
    newline); the
    rewards are the verifier's, and the evaluation's answers are those a plain `generate` of
    each model gives."""
    rows = real_task.make_prompt_rows(12, seed=0)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sampling = {"temperature": 1.0, "max_new_tokens": NEW_TOKENS}
    block = {
        "rank_weight": 1.0,
        "online": {"refresh_every": 2, "kl_coef": 0.0},
        "generate": {"backend": "transformers", "num_candidates": 4, "dedupe": False, **sampling},
        "judge": JUDGE,
        "eval": {"held_out": 4, "num_samples": 1, "temperature": 0.0, "max_new_tokens": NEW_TOKENS},
    }
    cfg = recipe(tmp_path, real_model, "rrhf", data, "pofe.prompts", pofe=block, sequence_len=160, **LORA)
    run_axolotl("train", str(cfg))

    tokenizer = AutoTokenizer.from_pretrained(real_model)
    turn_end = [IM_END, *tokenizer("\n", add_special_tokens=False)["input_ids"]]
    (refresh,) = sorted((tmp_path / "out" / "online").glob("refresh-*"))
    _, written, stats = read_refresh(refresh)
    assert sorted(r["prompt"] for r in written) == sorted(r["prompt"] for r in rows[:8])
    assert stats["candidates"] == 32
    stopped = 0
    for r in written:
        assert r["rewards"] == [real_task.reward(r["prompt"], text) for text in r["responses"]]
        for text, sampled, trained in zip(r["responses"], r["response_ids"], r[TOKENS]["response_ids"], strict=True):
            # the sampled ids, less the <|im_end|> generation stopped at (the model's only stop token)
            assert IM_END not in sampled and len(sampled) <= NEW_TOKENS and tokenizer.decode(sampled) == text
            stopped += len(sampled) < NEW_TOKENS
            # trained as the template's finished turn; cut ones too (RRHF's default `candidates.truncated: keep`)
            assert trained == sampled + turn_end
    assert stopped >= 4, stopped  # 9 of 32 here; the others talk past 24 tokens

    proc = run_axolotl("pofe", "eval", str(cfg), "--seed", "0")
    held = [r["prompt"] for r in rows[8:]]
    ev, samples = checked_eval_samples(RunFolder(tmp_path / "out" / "pofe-eval"), held, reward=real_task.reward)
    for name, model in (("pi_0", real_model), ("pi_1", tmp_path / "out")):
        answers = [s["response"] for s in sorted(samples, key=lambda s: s["prompt_index"]) if s["model"] == name]
        assert answers == greedy_answers(model, tokenizer, held), name
    assert "held-out prompts, greedy answers: pi_0 reward" in proc.stdout  # eval.temperature 0
