"""`benchmarks/gpu_check.sh --tiny`: the one-GPU check's code path on the CPU, so it cannot rot.

One run of `python -m benchmarks.gpu_check --tiny` (vLLM's stage skipped: starting the CPU engine
costs a minute and tests/preprocess/test_token_ids.py runs the same prompt-identity check on it),
then its JSON against numbers derived here: SPPO's step-1 loss from the win rates alone (the
log-ratio is 0 there), prefix sharing within float32 rounding, and every CUDA-only claim
reported as `needs GPU`, never as a pass.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest

from benchmarks.gpu_check import train
from benchmarks.gpu_check.__main__ import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu-check")
    assert main(["--tiny", "--skip", "generate", "--work", str(work), "--out", str(work / "check.json")]) == 0
    report = json.loads((work / "check.json").read_text())
    return report, {r["check"]: r for r in report["rows"]}, work


def test_sppo_step1_log_ratio_is_zero_and_loss_is_the_targets(tiny_check):
    report, rows, work = tiny_check
    run = report["train"]["sppo-kernels-off"]
    assert rows["train sppo-kernels-off"]["status"] == "pass"
    assert run["dtype"] == "float32" and len(run["losses"]) == 2 and not run["repack_warning"]
    assert abs(run["step1_logratio"]) <= run["step1_logratio_tolerance"] < 1e-3
    # log-ratio 0 at step 1: the loss is the mean over the batch's rows of mean_j (eta (w_j - 1/2))^2,
    # eta = 10, for whichever 4 of the 8 rows the sampler drew first
    rows_w = [json.loads(line)["win_rates"] for line in (work / "train" / "sppo.jsonl").read_text().splitlines()]
    per_row = [sum((10 * (w - 0.5)) ** 2 for w in ws) / len(ws) for ws in rows_w]
    batch_losses = [sum(s) / 4 for s in itertools.combinations(per_row, 4)]
    assert min(abs(run["losses"][0] - b) for b in batch_losses) <= 1e-5 * run["losses"][0]


def test_rrhf_trains_and_cuda_only_claims_say_needs_gpu(tiny_check):
    report, rows, _ = tiny_check
    run = report["train"]["rrhf-kernels-off"]
    assert rows["train rrhf-kernels-off"]["status"] == "pass" and all(map(math.isfinite, run["losses"]))
    assert len(run["losses"]) == 2 and not run["repack_warning"]
    for name in (
        "train sppo-kernels-on",
        "train rrhf-kernels-on",
        "train sppo kernels on == off",
        "train rrhf kernels on == off",
        "prefix sharing flash_attention_2",
        "prefix sharing flex_attention",
        "memory train sppo-kernels-off",
        "memory train rrhf-kernels-off",
    ):
        assert rows[name]["status"] == "needs GPU", rows[name]
    assert rows["stage generate"]["status"] == "skipped: --skip"
    # the plan's estimate is computed even where the GPU peak cannot be measured
    assert rows["memory train sppo-kernels-off"]["estimate_gb"] > 0
    assert report["tokenizer"] == {"template_writes_bos": True, "tokenizer_adds_bos": True, "text_prompt_bos_count": 2}


def test_prefix_sharing_equals_unshared_under_sdpa(tiny_check):
    _, rows, _ = tiny_check
    for layout in ("packed", "cache"):
        r = rows[f"prefix sharing sdpa {layout}"]
        assert r["status"] == "pass", r  # within float32 rounding of its sums (rtol 4 eps sqrt(n)), not bf16's


def test_speed_reports_tokens_per_second(tiny_check):
    _, rows, _ = tiny_check
    r = rows["speed sppo-pairs"]
    assert r["status"] == "measured" and r["tokens_per_second"]["pofe"] > 0 and r["ratios"]["speedup_vs_trl"] > 0


def _run(losses, logps, logratio=0.0, tolerance=1e-5):
    return {
        "returncode": 0,
        "losses": losses,
        "logps_chosen": logps,
        "repack_warning": False,
        "step1_logratio": logratio,
        "step1_logratio_tolerance": tolerance,
        "log": "x.log",
    }


def test_the_train_checks_can_fail():
    """A step-1 log-ratio past its tolerance, kernels off the bf16 tolerance, a repack warning: FAIL."""
    off = _run([1.0, 0.9], [-50.0, -49.0])
    on_close = _run([1.0 * (1 + train.KERNEL_RTOL / 2), 0.9], [-50.0, -49.0])
    on_far = _run([1.0 * (1 + 2 * train.KERNEL_RTOL), 0.9], [-50.0, -49.0])
    status = lambda res: {r["check"]: r["status"] for r in train.checks(res)}  # noqa: E731
    assert status({"sppo-kernels-off": off, "sppo-kernels-on": on_close})["train sppo kernels on == off"] == "pass"
    assert status({"sppo-kernels-off": off, "sppo-kernels-on": on_far})["train sppo kernels on == off"] == "FAIL"
    bad = {"sppo-kernels-off": _run([1.0], [-50.0], logratio=2e-5)}
    assert status(bad)["train sppo-kernels-off"] == "FAIL"
    repacked = {"rrhf-kernels-off": {**_run([1.0], [-50.0]), "repack_warning": True}}
    assert status(repacked)["train rrhf-kernels-off"] == "FAIL"


@pytest.mark.parametrize("method", ["sppo", "rrhf"])
@pytest.mark.parametrize("kernels", [False, True])
def test_the_gpu_recipes_validate_with_the_kernels_as_set(tmp_path, tiny_model, method, kernels):
    """The GPU's runs never execute here: their recipes pass axolotl's validation on an H100's
    capabilities with QLoRA, bf16 and each LoRA kernel exactly as the check sets it."""
    import yaml

    from pofe.args import LORA_KERNELS
    from tests.helpers import H100, validated_recipe

    cfg = validated_recipe(
        yaml.safe_load(train.recipe(tmp_path, tiny_model, method, kernels, 20, cuda=True).read_text()), H100
    )
    assert {k: bool(cfg[k]) for k in LORA_KERNELS} == dict.fromkeys(LORA_KERNELS, kernels)
    assert cfg.adapter == "qlora" and cfg.load_in_4bit and cfg.bf16 and cfg.max_steps == 20
    assert cfg.attn_implementation == "sdpa" and cfg.gradient_checkpointing


def test_the_vllm_check_fails_on_a_prompt_tokenised_again():
    """One prompt seen with a second BOS (what a text prompt gets) fails the identity check;
    all seen as sent, with one BOS and K samples each, passes."""
    from benchmarks.gpu_check import generate

    bos, n = 1, generate.PROMPTS
    sent = [[bos, 733, 10 + i, 28793] for i in range(n)]
    res = {
        "sent": sent,
        "seen": [list(s) for s in sent],
        "samples": [[[5, 2]] * generate.K] * n,
        "text_seen": [[bos, *s] for s in sent],
        "seconds": 2.0,
        "device_used_gib": None,
    }
    assert [r["status"] for r in generate.checks(res, bos)] == ["pass", "pass"]
    res["seen"][7] = [bos, *sent[7]]
    first = generate.checks(res, bos)[0]
    assert first["status"] == "FAIL" and "63/64 prompts seen as sent" in first["detail"]


def test_judges_stage_measures_the_reward_model_and_the_anchor_pass(tiny_check):
    """The reward-model judge's scores equal a plain forward's within float32 rounding (a `pass`
    that can fail: the bound is derived, not the difference's own), and both speed figures come
    from runs that scored the same candidates."""
    report, rows, _ = tiny_check
    r = rows["judge reward model scores == plain forward's"]
    assert r["status"] == "pass" and r["difference"] <= r["bound"] < 1e-3, r
    rm = report["judges"]["reward_model"]
    assert rm["candidates"] == 8 * 5 and set(rm["speed_pofe_over"]) == {"pofe_whole_texts", "plain"}
    assert rows["judge reward model vs plain forward"]["status"] == "measured"
    anchor = report["judges"]["anchor_pass"]
    assert anchor["rows"] == 8
    assert rows["anchor pass vs one epoch's forwards"]["status"] == "measured"
