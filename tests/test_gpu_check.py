"""`benchmarks/gpu_check.sh --tiny`: the one-GPU check's code path on the CPU, so it cannot rot.

One run of `python -m benchmarks.gpu_check --tiny` (vLLM's stage skipped: starting the CPU engine
costs a minute and tests/candidates/test_token_ids.py runs the same prompt-identity check on it),
then its JSON against numbers derived here: SPPO's step-1 loss from the win rates alone (the
log-ratio is 0 there), prefix sharing within float32 rounding, POFE's transformers backend
conditioned on the ids sent, and every CUDA-only claim reported as `needs GPU`, never as a pass.
That the check runs on the GPU machine's packages plus the bundle is
`python -m benchmarks.gpu_check.clean_venv`'s to show (tests/test_gpu_bundle.py checks the bundle).
"""

from __future__ import annotations

import itertools
import json
import math

import pytest

from benchmarks.gpu_check import speed, train
from benchmarks.gpu_check.__main__ import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory):
    work = tmp_path_factory.mktemp("gpu-check")
    assert main(["--tiny", "--skip", "vllm", "--work", str(work), "--out", str(work / "check.json")]) == 0
    report = json.loads((work / "check.json").read_text())
    return report, {r["check"]: r for r in report["rows"]}, work


def test_sppo_step1_log_ratio_is_zero_and_loss_is_the_targets(tiny_check):
    report, rows, work = tiny_check
    run = report["train"]["sppo-qlora-kernels-off"]
    assert rows["train sppo-qlora-kernels-off"]["status"] == "pass"
    assert run["dtype"] == "float32" and len(run["losses"]) == 2 and not run["repack_warning"]
    assert abs(run["step1_logratio"]) <= run["step1_logratio_tolerance"] < 1e-3
    # log-ratio 0 at step 1: the loss is the mean over the batch's rows of mean_j (eta (w_j - 1/2))^2,
    # eta = 10, for whichever 4 of the 8 rows the sampler drew first
    rows_w = [json.loads(line)["win_rates"] for line in (work / "train" / "sppo.jsonl").read_text().splitlines()]
    per_row = [sum((10 * (w - 0.5)) ** 2 for w in ws) / len(ws) for ws in rows_w]
    batch_losses = [sum(s) / 4 for s in itertools.combinations(per_row, 4)]
    assert min(abs(run["losses"][0] - b) for b in batch_losses) <= 1e-5 * run["losses"][0]


def test_rrhf_full_fine_tuning_trains_and_cuda_only_claims_say_needs_gpu(tiny_check):
    report, rows, _ = tiny_check
    run = report["train"]["rrhf-full"]
    assert rows["train rrhf-full"]["status"] == "pass" and all(map(math.isfinite, run["losses"]))
    assert len(run["losses"]) == 2 and not run["repack_warning"]
    for name in (
        "train sppo-qlora-kernels-on",
        "train rrhf-qlora-kernels-on",
        "train sppo qlora kernels on == off",
        "train rrhf qlora kernels on == off",
        "prefix sharing flash_attention_2",
        "prefix sharing flex_attention",
        "chunked logits memory",
        "memory train sppo-qlora-kernels-off",
        "memory train rrhf-full",
        "memory generate (transformers)",
    ):
        assert rows[name]["status"] == "needs GPU", rows[name]
    for name in ("train sppo-full", "train rrhf-qlora-kernels-off"):  # the GPU's; the CPU runs one of each kind
        assert rows[name]["status"].startswith("skipped: "), rows[name]
    assert set(report["train"]) == {"sppo-qlora-kernels-off", "rrhf-full"}
    assert rows["stage vllm"]["status"] == "skipped: not asked for"
    # the plan's estimate is computed even where the GPU peak cannot be measured
    assert rows["memory train sppo-qlora-kernels-off"]["estimate_gb"] > 0
    assert rows["memory generate (transformers)"]["estimate_gb"] > 0
    assert report["tokenizer"] == {"template_writes_bos": True, "tokenizer_adds_bos": True, "text_prompt_bos_count": 2}


def test_online_rrhf_samples_with_the_training_model_and_pi_0_is_its_base(tiny_check):
    """The online stage's QLoRA run: a refresh every 2 of 6 steps, 4 x 2 prompts each; at the first
    refresh the policy (B = 0) and its adapter-disabled base score every candidate alike (here the
    same float32 passes: a gap of exactly 0), and by the last the policy has moved."""
    report, rows, _ = tiny_check
    r = report["online"]
    assert rows["online rrhf-qlora (kl_coef 0.01)"]["status"] == "pass", rows["online rrhf-qlora (kl_coef 0.01)"]
    assert r["refresh_steps"] == [0, 2, 4] and r["refresh_prompts"] == [8.0, 8.0, 8.0]
    assert r["first_refresh_gaps"]["worst_over_tolerance"] == 0.0 and r["first_refresh_gaps"]["candidates"] >= 16
    assert r["kl_to_pi_0"][0] == 0.0 and r["kl_to_pi_0"][-1] > 0.0
    assert len(r["losses"]) == 6 and not r["repack_warning"]


def test_prefix_sharing_equals_unshared_under_sdpa_and_is_timed(tiny_check):
    _, rows, _ = tiny_check
    for layout in ("packed", "cache"):
        r = rows[f"prefix sharing sdpa {layout}"]
        assert r["status"] == "pass", r  # within float32 rounding of its sums (rtol 4 eps sqrt(n)), not bf16's
    r = rows["prefix speed sdpa"]
    assert r["status"] == "measured" and set(r["seconds"]) == {"unshared", "packed", "cache"}
    assert all(s > 0 for s in r["seconds"].values()) and set(r["speedup"]) == {"packed", "cache"}
    # both chunkings ran on the CPU; only CUDA's allocator resolves their peaks
    assert set(rows["chunked logits memory"]["peak_extra_mib"]) == {"chunk 1024", "unchunked"}


def test_transformers_generation_conditions_on_the_ids_sent(tiny_check):
    """POFE's transformers backend, the GPU machine's stand-in for vLLM: all 64 prompts seen as
    the trainer's ids, one BOS each, K samples each."""
    report, rows, _ = tiny_check
    r = rows["transformers K=5 x 64 from token ids"]
    assert r["status"] == "pass" and "64/64 prompts seen as sent, 64 with one BOS, 64 with 5 samples" in r["detail"]
    assert report["generate"]["max_prompt_tokens"] > 0 and report["generate"]["peak_gpu_gib"] is None


def test_speed_reports_tokens_per_second_and_mfu(tiny_check):
    _, rows, _ = tiny_check
    r = rows["speed sppo-pairs"]
    assert r["status"] == "measured" and r["tokens_per_second"]["pofe"] > 0 and r["ratios"]["speedup_vs_trl"] > 0
    m = rows["MFU sppo-pairs"]
    assert m["status"] == "measured" and 0 < m["mfu_vs_measured_matmul"] and "mfu_vs_datasheet" not in m


def test_model_flops_by_hand():
    """hidden 4, intermediate 8, vocab 10, 2 heads, 1 KV head (kv width 2), 1 layer: q and o
    2 x 16, k and v 2 x 4 x 2, gate, up, down 3 x 4 x 8: 144 parameters. One prompt of 3
    tokens, k = 2 responses of 2: 7 unique tokens, 4 scored. 6 x 144 x 7 + 6 x 40 x 4 = 7008."""
    config = dict(hidden_size=4, intermediate_size=8, vocab_size=10, num_attention_heads=2)
    config |= dict(num_key_value_heads=1, num_hidden_layers=1)
    workload = {"prompts": 1, "k": 2, "prompt_len": 3, "response_len": 2}
    assert speed.model_flops(config, workload) == 7008


def test_model_flops_count_the_models_own_parameters():
    """The layer count of model_flops is a Llama's parameters but its embeddings, norms and head."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.run import MODELS

    config = MODELS["1b"]  # 32 heads over 4 KV heads, on the meta device: no memory
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**config))
    layers = sum(p.numel() for n, p in model.model.layers.named_parameters() if "norm" not in n)
    one_token = {"prompts": 1, "k": 1, "prompt_len": 0, "response_len": 1}  # 1 unique token, 1 scored
    head = config["hidden_size"] * config["vocab_size"]
    assert speed.model_flops(config, one_token) == 6 * layers + 6 * head


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
    equal = "train sppo qlora kernels on == off"
    assert status({"sppo-qlora-kernels-off": off, "sppo-qlora-kernels-on": on_close})[equal] == "pass"
    assert status({"sppo-qlora-kernels-off": off, "sppo-qlora-kernels-on": on_far})[equal] == "FAIL"
    bad = {"sppo-full": _run([1.0], [-50.0], logratio=2e-5)}
    assert status(bad)["train sppo-full"] == "FAIL"
    repacked = {"rrhf-qlora-kernels-off": {**_run([1.0], [-50.0]), "repack_warning": True}}
    assert status(repacked)["train rrhf-qlora-kernels-off"] == "FAIL"


@pytest.mark.parametrize("method, adapter, kernels", train.RUNS)
def test_the_gpu_recipes_validate_with_the_kernels_as_set(tmp_path, tiny_model, method, adapter, kernels):
    """The GPU's runs never execute here: their recipes pass axolotl's validation on an H100's
    capabilities with full fine-tuning or QLoRA, bf16 and each LoRA kernel exactly as the check
    sets it."""
    import yaml

    from pofe.args.translate import LORA_KERNELS
    from tests.helpers import H100, validated_recipe

    path = train.recipe(tmp_path, tiny_model, method, adapter, kernels, 20, cuda=True)
    cfg = validated_recipe(yaml.safe_load(path.read_text()), H100)
    assert {k: bool(cfg[k]) for k in LORA_KERNELS} == dict.fromkeys(LORA_KERNELS, kernels)
    assert (cfg.adapter, bool(cfg.load_in_4bit)) == (("qlora", True) if adapter == "qlora" else (None, False))
    assert cfg.bf16 and cfg.max_steps == 20 and cfg.save_only_model
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
    assert [r["status"] for r in generate.vllm_checks(res, bos)] == ["pass", "pass"]
    res["seen"][7] = [bos, *sent[7]]
    first = generate.vllm_checks(res, bos)[0]
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


def test_online_nash_md_samples_the_mixture_and_pi_0_is_its_base(tiny_check):
    """The online stage's Nash-MD run (QLoRA, the verifier judging each sample against the mixture's
    opponent): refreshes at 0, 2, 4 of 8 prompts; at the first the policy (B = 0) and pi_0 score
    every sample alike (the same float32 passes: a gap of exactly 0) and the mixture is the policy
    (its per-token KL from it is float32 rounding); by the last both have moved."""
    report, rows, _ = tiny_check
    r = report["online_nash_md"]
    assert rows["online nash_md-qlora (mixture 0.125)"]["status"] == "pass", rows[
        "online nash_md-qlora (mixture 0.125)"
    ]
    assert r["refresh_steps"] == [0, 2, 4] and r["refresh_prompts"] == [8.0, 8.0, 8.0]
    assert r["first_refresh_gaps"]["worst_over_tolerance"] == 0.0 and r["first_refresh_gaps"]["candidates"] >= 16
    assert abs(r["mixture_kl"][0]) < 1e-6 and r["kl_to_pi_0"][0] == 0.0 and r["kl_to_pi_0"][-1] > 0.0
    assert len(r["losses"]) == 6 and not r["repack_warning"]
