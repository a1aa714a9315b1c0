"""`axolotl pofe plan` of an online recipe (`pofe.online`): one train stage, whose parts are the
training state of the same recipe planned offline plus what shares its GPU in the one
`axolotl train` process (the policy's own sampling, a model judge, pi_0's frozen copy under
full fine-tuning with kl_coef, ZeRO-3's gathered weights), each derived here from
`pofe.run.plan.estimate`'s functions on Mistral-7B's published config."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.plan_table import PROMPTS, write_hub_cache
from pofe.run.plan import estimate as mem
from pofe.run.plan.common import PlanOptions
from pofe.run.plan.estimate import GB
from pofe.run.plan.planner import plan_recipe, plan_run
from pofe.run.recipe import translated_recipe
from tests.helpers import CPU, ROOT, validated_recipe

MISTRAL = "mistralai/Mistral-7B-Instruct-v0.2"
BF16 = "bfloat16"
FULL = {"adapter": None, "load_in_4bit": False}
ZERO3 = str(ROOT / "recipes" / "deepspeed" / "zero3_bf16.json")
SETUPS = {  # name -> (recipe keys over rrhf-qlora's, GPUs)
    "qlora": ({}, 1),
    "lora": ({"adapter": "lora", "load_in_4bit": False}, 1),
    "full": (FULL, 1),
    "zero3": ({**FULL, "deepspeed": ZERO3}, 8),
    # the planner holds an adapter's base weights whole on each GPU (`train_memory`): nothing to gather
    "lora-zero3": ({"adapter": "lora", "load_in_4bit": False, "deepspeed": ZERO3}, 8),
}


def _rrhf(setup: str) -> dict:
    """rrhf-qlora.yml (transformers backend, 8 prompts x 4 candidates a batch, sequence_len 1024,
    max_new_tokens 128) on Mistral-7B, judged by a reward model of Mistral's size (8 x 1024
    tokens a forward), without evaluation."""
    raw = yaml.safe_load((ROOT / "recipes" / "rrhf-qlora.yml").read_text())
    judge = {"type": "reward_model", "model": MISTRAL, "batch_size": 8, "max_length": 1024}
    raw["pofe"] = {**raw["pofe"], "judge": judge, "eval": False}
    return {**raw, "base_model": MISTRAL, **SETUPS[setup][0]}


def _online(raw: dict, kl_coef: float) -> dict:
    return {**raw, "pofe": {**raw["pofe"], "online": {"refresh_every": 8, "kl_coef": kl_coef}}}


@pytest.fixture(scope="module")
def sizes(tmp_path_factory):
    from unittest import mock

    from huggingface_hub import constants

    from pofe.run.plan.sources import model_sizes

    cache = tmp_path_factory.mktemp("hub")
    write_hub_cache(cache)
    sppo = _sppo()
    with mock.patch.object(constants, "HF_HUB_CACHE", str(cache)):
        found = {}
        for raw in (_rrhf("qlora"), sppo):
            sized, warnings = model_sizes(raw, translated_recipe(raw)[1])
            assert warnings == []
            found |= sized
    return found


def _plan(raw: dict, sizes: dict, gpus: int = 1) -> dict:
    return plan_run(*translated_recipe(raw), sizes, PROMPTS, PlanOptions(gpus=gpus))


def _round_1(plan: dict, name: str) -> dict:
    return next(s for s in plan["stages"] if s["stage"] == name and s["round"] == 1)


def _gb(parts: dict[str, float]) -> dict[str, float]:
    return {k: round(v / GB, 2) for k, v in parts.items()}


@pytest.mark.parametrize(
    "setup, kl_coef, copy",
    [
        ("qlora", 0.01, False),
        ("lora", 0.01, False),
        ("full", 0.01, True),
        ("full", 0.0, False),
        ("zero3", 0.01, True),
        ("lora-zero3", 0.01, False),
    ],
)
def test_an_online_run_is_one_stage_holding_the_generator_judge_and_pi_0(sizes, setup, kl_coef, copy):
    """The online plan lists one train stage, of no round: the offline train stage's parts and
    counts, plus the policy's own KV cache (2 x 32 layers x 1024 kv width x 2 bytes, for 8 x 4
    sequences of 1024 + 128 tokens) and decode step, the reward model kept for the run (its
    judge stage's parts but the CUDA context, which the process has once), under ZeRO-3 the
    whole bf16 weights gathered for a refresh, and pi_0's bf16 copy only under full fine-tuning
    with kl_coef > 0 (under LoRA/QLoRA pi_0 is the adapter-disabled policy)."""
    raw, gpus = _rrhf(setup), SETUPS[setup][1]
    offline, online = _plan(raw, sizes, gpus), _plan(_online(raw, kl_coef), sizes, gpus)
    assert [(s["stage"], s["round"]) for s in online["stages"]] == [("train", None)]
    (entry,) = online["stages"]
    train = _round_1(offline, "train")
    size = sizes[MISTRAL]
    assert mem.kv_bytes_per_token(size, BF16) == 2 * 32 * 1024 * 2
    beside = {
        "generate_kv_cache": 2 * 32 * 1024 * 2 * (8 * 4) * (1024 + 128),
        "generate_forward": mem.forward_bytes(size, 8 * 4, BF16) + mem.logit_chunk_bytes(size, 8 * 4),
        "judge_weights": mem.weights_bytes(size, BF16),
        "judge_forward": mem.forward_bytes(size, 8 * 1024, BF16),
        "judge_prefix_kv": 2 * mem.kv_bytes_per_token(size, BF16) * 8 * 1024,
    }
    if setup == "zero3":
        beside["zero3_gathered_weights"] = 2 * size.total
    if copy:
        beside["pi_0_weights"] = 2 * size.total
    assert entry["parts_gb"] == train["parts_gb"] | _gb(beside)
    # the total: the offline training entry plus what shares its GPU (each part rounded to 0.01 GB)
    assert abs(entry["gpu_memory_gb"] - train["gpu_memory_gb"] - sum(beside.values()) / GB) <= 0.01 * len(beside)
    judge = _round_1(offline, "judge")["parts_gb"]
    assert {k: v for k, v in judge.items() if k != "runtime"} == {
        k.removeprefix("judge_"): v for k, v in entry["parts_gb"].items() if k.startswith("judge_")
    }
    assert entry["counts"] == train["counts"] and entry["disk_gb"] == train["disk_gb"]
    assert (entry["gpus"], entry["data_parallel"]) == (gpus, gpus) and entry["dtype"] == BF16
    assert "generate, judge and train share the training GPU(s)" in entry["note"]


def _sppo() -> dict:
    """sppo-qlora.yml on one prompt set, sampled by the transformers backend (8 prompts x 5
    candidates of 1024 + 500 tokens a batch), without evaluation."""
    raw = yaml.safe_load((ROOT / "recipes" / "sppo-qlora.yml").read_text())
    pofe = {k: v for k, v in raw["pofe"].items() if k not in ("rounds", "round_prompts")}
    pofe["generate"] = {**pofe["generate"], "backend": "transformers"}
    return {**raw, "pofe": {**pofe, "eval": False}}


def test_online_sppo_holds_pairrm_and_no_pi_0(sizes):
    """SPPO online (no kl_coef: its anchor is the sampling policy) under QLoRA, judged by PairRM:
    the offline train stage's parts, the policy's KV cache, and PairRM's parts as its judge
    stage sizes them, but the CUDA context."""
    offline, online = _plan(_sppo(), sizes), _plan(_online(_sppo(), 0.0), sizes)
    (entry,) = online["stages"]
    size = sizes[MISTRAL]
    judge = {k: v for k, v in _round_1(offline, "judge")["parts_gb"].items() if k != "runtime"}
    kv = mem.kv_bytes_per_token(size, BF16) * (8 * 5) * (1024 + 500)  # sequence_len + the recipe's max_new_tokens
    forward = mem.forward_bytes(size, 8 * 5, BF16) + mem.logit_chunk_bytes(size, 8 * 5)
    expected = _round_1(offline, "train")["parts_gb"] | _gb({"generate_kv_cache": kv, "generate_forward": forward})
    assert entry["parts_gb"] == expected | {f"judge_{k}": v for k, v in judge.items()}
    assert set(judge) == {"weights", "forward"} and "pi_0_weights" not in entry["parts_gb"]


def test_an_online_run_too_large_names_the_sampling_keys(sizes):
    """Full fine-tuning of Mistral-7B online with kl_coef (about 102 GB) exceeds an 80 GB GPU:
    the warning names the train stage's keys and the sampling's and the judge's."""
    plan = _plan(_online(_rrhf("full"), 0.01), sizes)
    assert plan["stages"][0]["gpu_memory_gb"] > 80
    (said,) = [w for w in plan["warnings"] if w.startswith("train:")]
    assert "micro_batch_size" in said and "pofe.generate.batch_size or max_new_tokens" in said
    assert "pofe.judge.batch_size or max_length" in said


def test_the_tiny_online_recipe_plans_on_the_cpu(tiny_model, tmp_path):
    """recipes/tiny-rrhf-online-cpu.yml on the tests' tiny Llama, as `axolotl pofe plan` reads it:
    axolotl accepts it; one train stage on the CPU, in float32, whose Python judge holds nothing
    and whose kl_coef 0 loads no copy of pi_0; the text says the
    stages share the training GPU(s) and how often it refreshes."""
    from pofe.run.plan.render import render_text

    raw = yaml.safe_load((ROOT / "recipes" / "tiny-rrhf-online-cpu.yml").read_text())
    raw |= {"base_model": str(tiny_model), "output_dir": str(tmp_path / "out"), "pofe": {**raw["pofe"], "eval": False}}
    assert validated_recipe(raw, CPU).pofe["online"] == {
        "refresh_every": 3,
        "kl_coef": 0.0,
        "monitor_every": 10,
        "monitor_samples": 2,
    }
    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(raw))
    plan = plan_recipe(recipe, PlanOptions(device=None), prompts=60)
    (entry,) = plan["stages"]
    assert (entry["stage"], entry["device"], entry["dtype"]) == ("train", "cpu", "float32")
    assert set(entry["parts_gb"]) == {
        *("weights", "trainable_state", "activations", "logits", "runtime"),
        *("generate_kv_cache", "generate_forward"),
    }
    text = render_text(plan)
    # `axolotl train`'s 60 prompts in micro-batches of 20, 50 epochs; the CPU, no GPU named
    assert text.startswith(
        f"planned: axolotl train {recipe} (rrhf, online, a refresh every 3 steps, 60 prompts, 150 steps)\n"
        "on: the CPU, memory is the process's resident set (device cpu: "
    )
    assert "\ntrain: " in text and "(pofe.online: generate, judge and train share the training GPU(s)" in text


def test_what_sampling_holds_follows_the_backend(sizes):
    """The training model's sampling (transformers) against colocated vLLM's share of the GPU
    (vllm: gpu_memory_utilization, default 0.3, of the GPU's 80 GB) and a server's nothing
    (openai): the rest of the stage is the same."""
    parts = {}
    sample = {"strategy": "sample", "num_beam_groups": 1, "diversity_penalty": 0.0}
    for name, generate in {
        "transformers": {},
        "vllm": {**sample, "backend": "vllm"},
        "vllm 0.5": {**sample, "backend": "vllm", "vllm_kwargs": {"gpu_memory_utilization": 0.5}},
        "openai": {**sample, "backend": "openai", "base_url": "http://127.0.0.1:8000/v1"},
    }.items():
        raw = _online(_rrhf("qlora"), 0.0)
        raw["pofe"] = {**raw["pofe"], "generate": {**raw["pofe"]["generate"], **generate}}
        (entry,) = _plan(raw, sizes, 1)["stages"]
        parts[name] = entry["parts_gb"]
    sampling = {"generate_kv_cache", "generate_forward"}
    assert sampling <= set(parts["transformers"])
    rest = {k: v for k, v in parts["transformers"].items() if k not in sampling}
    assert parts["vllm"] == {**rest, "generate_vllm_share": pytest.approx(0.3 * 80, abs=0.01)}
    assert parts["vllm 0.5"]["generate_vllm_share"] == pytest.approx(0.5 * 80, abs=0.01)
    assert parts["openai"] == rest


def _nash_md(**changes) -> dict:
    """nash-md-qlora-online.yml (transformers backend, 8 prompts x 2 samples of 1024 + 512 tokens a
    batch, PairRM) on Mistral-7B, without evaluation."""
    raw = yaml.safe_load((ROOT / "recipes" / "nash-md-qlora-online.yml").read_text())
    return {**raw, "pofe": {**raw["pofe"], "eval": False}, **changes}


def test_online_nash_md_holds_pi_0s_cache_beside_the_policys(sizes):
    """Nash-MD samples each opponent from the mixture with the training model, pi_0 beside it token
    by token: its plan holds pi_0's KV cache for those sequences, the size of the policy's own
    (2 x 32 layers x 1024 kv width x 2 bytes, for 8 x 2 sequences of 1024 + 512 tokens); under
    full fine-tuning pi_0's bf16 copy even with kl_coef 0 (the mixture and the loss's KL read it);
    with a vLLM backend the training model's own cache and decode step for the mixture too."""
    size = sizes[MISTRAL]
    kv = 2 * 32 * 1024 * 2 * (8 * 2) * (1024 + 512)
    forward = mem.forward_bytes(size, 8 * 2, BF16) + mem.logit_chunk_bytes(size, 8 * 2)
    (qlora,) = _plan(_nash_md(), sizes)["stages"]
    parts = qlora["parts_gb"]
    assert parts["mixture_pi_0_kv_cache"] == parts["generate_kv_cache"] == _gb({"kv": kv})["kv"]
    assert "pi_0_weights" not in parts and "mixture_kv_cache" not in parts
    full = _nash_md(**FULL)
    full["pofe"]["online"] = {**full["pofe"]["online"], "kl_coef": 0.0}
    (entry,) = _plan(full, sizes)["stages"]
    assert entry["parts_gb"]["pi_0_weights"] == _gb({"w": 2 * size.total})["w"]
    colocated = _nash_md()
    colocated["pofe"]["generate"] = {**colocated["pofe"]["generate"], "backend": "vllm"}
    colocated["pofe"]["generate"].pop("batch_size")
    (entry,) = _plan(colocated, sizes)["stages"]
    assert {k: entry["parts_gb"][k] for k in ("mixture_kv_cache", "mixture_forward")} == _gb(
        {"mixture_kv_cache": kv, "mixture_forward": forward}
    )
