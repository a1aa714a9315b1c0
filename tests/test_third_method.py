"""A method registered from outside the package trains through the real CLI.

`tests/methods/listwise.py` defines ListNet (a listwise loss over rewards, with a label
column of its own) and registers it; nothing under `plugin/` or `preprocess/` names it.
Prompts -> `axolotl preprocess` (generate + judge) -> `axolotl train`, as for RRHF and SPPO.
This process never imports that module: the registry here keeps only POFE's own methods,
and the checks below compute ListNet again, by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pofe.demo.task import make_prompt_rows, reward, write_jsonl
from pofe.methods import METHODS
from tests.helpers import ROOT, log_history, recipe, run_axolotl

pytestmark = pytest.mark.e2e

REPO = ROOT


def listnet(model_path: Path, rows: list[dict]) -> float:
    """Mean over rows of -sum_j softmax(r)_j log softmax(s)_j, s_j = log pi(y_j|x) / |y_j|,
    with each response scored as the trainer renders it (its assistant turn after the prompt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pofe.data.tokenize import render_row
    from pofe.run.evaluation.answers import sequence_logps

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    total = 0.0
    for row in rows:
        messages = {
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "responses": [{"role": "assistant", "content": r} for r in row["responses"]],
        }
        prompt_text, response_texts = render_row(messages, tokenizer)
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        response_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in response_texts]
        logps = sequence_logps(model, [prompt_ids] * len(response_ids), response_ids)
        scores = [lp / len(ids) for lp, ids in zip(logps, response_ids)]
        z_r = math.log(sum(math.exp(r) for r in row["scores"]))
        z_s = math.log(sum(math.exp(s) for s in scores))
        total -= sum(math.exp(r - z_r) * (s - z_s) for r, s in zip(row["scores"], scores))
    return total / len(rows)


def test_method_registered_outside_the_package_trains(tmp_path, tiny_model):
    assert "listwise" not in METHODS
    data = tmp_path / "prompts.jsonl"
    write_jsonl(make_prompt_rows(12, k_wrong=2, seed=3), data)
    pofe = {
        "generate": {
            "backend": "transformers",
            "num_candidates": 2,
            "temperature": 1.0,
            "max_new_tokens": 4,
            "seed": 0,
            "include_dataset_responses": ["answer", "near_misses"],
        },
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    }
    cfg = recipe(
        tmp_path,
        tiny_model,
        "listwise",
        data,
        "pofe.prompts",
        pofe=pofe,
        plugins=["tests.methods.listwise.ListwisePlugin", "pofe.PofePlugin"],
        num_epochs=3,
        learning_rate=3e-3,
    )
    run_axolotl("preprocess", str(cfg), cwd=REPO, env={"PYTHONPATH": str(REPO)})

    (cand_dir,) = (tmp_path / "prepared").glob("pofe-candidates-*")
    rows = [json.loads(line) for line in (cand_dir / "data.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    for row in rows:
        # the method's own label column, filled with the judge's rewards; the sampled ids ride
        # along for training, one list per response
        assert set(row) == {"prompt", "responses", "scores", "response_ids"}
        assert len(row["response_ids"]) == len(row["responses"])
        assert row["scores"] == [reward(row["prompt"], r) for r in row["responses"]]

    run_axolotl("train", str(cfg), cwd=REPO, env={"PYTHONPATH": str(REPO)})
    steps = [h for h in log_history(tmp_path / "out") if "loss" in h]
    assert len(steps) == 3 * 3  # 12 rows / 4 per step, 3 epochs
    # the trainer's loss is ListNet's: the logged metric and the optimised loss agree
    for h in steps:
        assert h["listwise/loss"] == pytest.approx(h["loss"], rel=1e-4)
    before, after = listnet(tiny_model, rows), listnet(tmp_path / "out", rows)
    # margin: over data, generation and training seeds 0-4 (one torch thread) ListNet fell by
    # 0.045-0.059 from about 1.61 (seed 0, this test's: 0.059); 0.05 would have failed seed 4
    assert after < before - 0.02, (before, after)
