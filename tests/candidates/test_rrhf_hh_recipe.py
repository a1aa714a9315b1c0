"""The shipped RRHF recipe's pipeline, tiny, on the CPU: HH prompts -> samples + the
dataset's responses -> reward model -> `axolotl train`, through the real CLI.

Only the models, the data file, the sizes and the CPU settings are swapped; the recipe's
`prompt_format`, `generate` and `judge` choices run as shipped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import CPU_SETTINGS, ROOT, log_history, run_axolotl

pytestmark = pytest.mark.e2e

RECIPE = ROOT / "recipes" / "rrhf-qlora.yml"
# Dahoas/rm-static's layout: an HH prompt up to the final "Assistant:", responses after it
ROWS = [
    {
        "prompt": "\n\nHuman: Name a fruit.\n\nAssistant: A pear.\n\nHuman: Another one?\n\nAssistant:",
        "chosen": " An apple.",
        "rejected": " No.",
    },
    {
        "prompt": "\n\nHuman: Two lines:\n\nsay hi, then bye.\n\nAssistant:",
        "chosen": " Hi.\n\nBye.",
        "rejected": " Bye.",
    },
    {"prompt": "\n\nHuman: What is 2+2?\n\nAssistant:", "chosen": " 4.", "rejected": " 5."},
    {"prompt": "\n\nHuman: Say yes.\n\nAssistant:", "chosen": " Yes.", "rejected": " Maybe."},
]
TURNS = [
    [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "A pear."},
        {"role": "user", "content": "Another one?"},
    ],
    [{"role": "user", "content": "Two lines:\n\nsay hi, then bye."}],
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Say yes."}],
]
# RRHF's pair metrics (its scores under its own names, TRL's summed log-probs under TRL's)
PAIR_KEYS = [
    "rrhf/worst_score",
    "rrhf/score_margin",
    "rrhf/best_above_worst",
    "logps/chosen",
    "logps/rejected",
]


def tiny_recipe(tmp_path, policy, reward_model) -> Path:
    data = tmp_path / "hh.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = yaml.safe_load(RECIPE.read_text())
    for key in (
        "adapter",
        "load_in_4bit",
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_linear",
        "warmup_ratio",
        "save_steps",
        "gradient_checkpointing",
    ):
        cfg.pop(key)
    (entry,) = cfg["datasets"]
    entry.update(path=str(data), split="train")
    cfg["pofe"]["generate"].update(max_new_tokens=4, seed=0)  # diverse beam search, 4 groups, as shipped
    cfg["pofe"]["judge"].update(model=str(reward_model), batch_size=4)
    cfg.update(
        base_model=str(policy),
        dataset_prepared_path=str(tmp_path / "prepared"),
        output_dir=str(tmp_path / "out"),
        sequence_len=256,
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        logging_steps=1,
        save_strategy="epoch",
        lr_scheduler="constant",
        learning_rate=1e-3,
        **CPU_SETTINGS,
    )
    path = tmp_path / "rrhf-hh.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@torch.no_grad()
def reward(model, tokenizer, turns, response) -> float:
    """The reward model's score of one conversation, rendered here with its chat template."""
    text = tokenizer.apply_chat_template(turns + [{"role": "assistant", "content": response}], tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    return model(**ids).logits[0, 0].item()


def test_hh_prompts_to_trained_model(tmp_path, tiny_policy, tiny_reward_model):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    cfg = tiny_recipe(tmp_path, tiny_policy, tiny_reward_model)
    run_axolotl("preprocess", str(cfg))

    (cand_dir,) = (tmp_path / "prepared").glob("pofe-candidates-*")
    rows = [json.loads(line) for line in (cand_dir / "data.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == TURNS  # chat turns, not one user turn holding "Human:"
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model).eval()
    rm_tokenizer = AutoTokenizer.from_pretrained(tiny_reward_model)
    for row, raw in zip(rows, ROWS):
        # the dataset's two responses join the samples, as text after "Assistant:"
        for column in ("chosen", "rejected"):
            j = row["responses"].index(raw[column].strip())
            # scored on the whole conversation, turn by turn
            assert row["rewards"][j] == pytest.approx(
                reward(rm, rm_tokenizer, row["prompt"], raw[column].strip()), abs=1e-4
            )
        assert 3 <= len(row["responses"]) <= 6  # + 4 beams, less any duplicate or empty one

    run_axolotl("train", str(cfg))
    steps = [h for h in log_history(tmp_path / "out") if "loss" in h]
    assert len(steps) == 2
    for h in steps:
        for key in PAIR_KEYS + ["rrhf/rank", "rrhf/ft", "rrhf/best_score"]:
            assert math.isfinite(h[key]), key
        assert not [k for k in h if k.startswith("rewards/")]  # RRHF has no implicit reward (issue 44)
        # every prompt's reward-model scores differ, so every prompt has a pair: the pair's best score
        # is the loss's best_score
        assert h["rrhf/score_margin"] == pytest.approx(h["rrhf/best_score"] - h["rrhf/worst_score"], abs=1e-4)
        assert h["rrhf/best_score"] < 0 and h["logps/chosen"] <= h["rrhf/best_score"]  # logp / n, n >= 1
