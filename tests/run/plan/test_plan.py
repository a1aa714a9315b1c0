"""`axolotl pofe plan`: the README's table comes from it, its numbers are the hand-computed ones
for Mistral-7B, and it warns (naming the key) where a run would not fit or would misbehave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.plan_table import CASES, CLAIMS, PROMPTS, claim_plans, claim_text, over_the_gpu, plans, write_hub_cache
from pofe.args.translate import LORA_KERNELS
from pofe.run.plan.common import PlanOptions
from pofe.run.plan.estimate import GB
from pofe.run.plan.planner import plan_recipe, plan_run
from pofe.run.plan.render import BEGIN, END, readme_table
from pofe.run.plan.sources import disk_warning, double_bos, model_sizes, prompt_rows
from pofe.run.recipe import translated_recipe
from tests.helpers import ROOT, run_axolotl

# Mistral-7B's parameters, counted by hand from its published config.json: per layer q and o
# 4096 x 4096, k and v 4096 x 1024, gate, up and down 4096 x 14336; embeddings and lm_head 32000 x 4096;
# two RMSNorms a layer and a final one
LAYER_LINEAR = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
OTHER = 2 * 32000 * 4096 + (2 * 32 + 1) * 4096
TOTAL = LAYER_LINEAR + OTHER
LORA_R16 = 32 * 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 14336) * 3)


@pytest.fixture(scope="module")
def mistral_plans():
    return plans()


def test_mistral_counts_are_the_published_ones():
    assert TOTAL == 7_241_732_096  # Mistral-7B's published parameter count
    assert LORA_R16 == 41_943_040


def test_readme_table_is_plans_output(mistral_plans):
    """README.md's memory table is `plan`'s: regenerate with `python -m benchmarks.plan_table --write`."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(BEGIN) + len(BEGIN) : readme.index(END)].strip()
    assert block == readme_table(mistral_plans)


def test_qlora_training_memory_is_the_hand_computed_one(mistral_plans):
    qlora = mistral_plans[next(iter(CASES))]
    train = next(s for s in qlora["stages"] if s["stage"] == "train" and s["round"] == 1)
    nf4 = LAYER_LINEAR * (0.5 + 1 / 64 + 4 / (64 * 256)) + OTHER * 2
    tokens = 2 * 2 * 1024  # micro_batch_size 2 prompts x best_worst's 2 responses x sequence_len 1024
    activations = tokens * (32 * 4096 + 9 * 4096 + 2 * 1024 + 4 * 14336) * 2
    expected = {
        "weights": nf4,
        "trainable_state": LORA_R16 * 16,
        "activations": activations,
        "logits": 1024 * 32000 * 4,
        "runtime": 0.5 * GB,
    }
    assert train["parts_gb"] == {k: round(v / GB, 2) for k, v in expected.items()}
    assert train["gpu_memory_gb"] == round(sum(expected.values()) / GB, 2)
    assert train["quantization"] == "nf4" and train["gpus"] == 1
    # 20000 prompts a round (one of the authors' sets per round); every ordered pair of K = 5
    # judged by PairRM
    judges = [s for s in qlora["stages"] if s["stage"] == "judge"]
    assert [s["counts"]["judge_calls"] for s in judges] == [20000 * 5 * 4] * 3
    merged = next(s for s in qlora["stages"] if s["stage"] == "merge" and s["round"] == 1)
    assert merged["disk_gb"] == round(TOTAL * 2 / GB, 2)  # the bf16 merged model


def test_zero3_uses_deepspeeds_estimator(mistral_plans):
    """ZeRO-3 over 8 GPUs: DeepSpeed's 18 bytes a parameter / 8, plus 4 bytes x the largest
    module (the embeddings, 32000 x 4096), as `estimate_zero3_model_states_mem_needs` says."""
    zero3 = mistral_plans[list(CASES)[1]]
    train = next(s for s in zero3["stages"] if s["stage"] == "train" and s["round"] == 1)
    assert train["parts_gb"]["zero3_model_states"] == round((18 * TOTAL / 8 + 4 * 32000 * 4096) / GB, 2)
    assert train["gpus"] == 8 and train["data_parallel"] == 8
    # 20000 prompts / (1 x 8 x 8) = 313 steps; saves every 100 steps, save_total_limit 1 keeps
    # one checkpoint of DeepSpeed's full state (16 bytes a parameter), and the bf16 model at the end
    assert train["counts"]["steps"] == 313 and train["counts"]["checkpoints_kept"] == 1
    assert train["disk_gb"] == round((16 * TOTAL + 2 * TOTAL) / GB, 2)


def test_one_entry_per_stage_with_its_memory_and_disk(mistral_plans):
    for plan in mistral_plans.values():
        names = [(s["stage"], s["round"]) for s in plan["stages"]]
        per_round = ["generate", "judge", "train"] + (["merge"] if plan["gpus"] == 1 else [])
        assert names == [(n, t) for t in (1, 2, 3) for n in per_round] + [
            ("eval-answers", None),  # on the rounds' vLLM engine (pofe.eval.backend: auto)
            ("eval-logprobs", None),  # then the answers scored with transformers
            ("eval-judging", None),
        ]
        for s in plan["stages"]:
            assert {"stage", "round", "gpu_memory_gb", "disk_gb"} <= set(s)
            assert s["gpu_memory_gb"] is not None and s["disk_gb"] is not None


def _recipe(**over) -> dict:
    raw = yaml.safe_load((ROOT / "recipes" / "sppo-qlora.yml").read_text())
    raw.update(over)
    return raw


@pytest.fixture(scope="module")
def mistral_sizes(tmp_path_factory):
    from unittest import mock

    from huggingface_hub import constants

    from pofe.args import pofe_config

    cache = tmp_path_factory.mktemp("hub")
    write_hub_cache(cache)
    raw = _recipe()
    with mock.patch.object(constants, "HF_HUB_CACHE", str(cache)):
        sizes, warnings = model_sizes(raw, pofe_config(raw))
    assert warnings == [] and sizes["mistralai/Mistral-7B-Instruct-v0.2"].total == TOTAL
    return sizes


def plan_of(raw: dict, sizes: dict, prompts: int | None, options: PlanOptions) -> dict:
    """`plan_run` of a recipe's YAML as `plan_recipe` plans it: translated as POFE translates it."""
    return plan_run(*translated_recipe(raw), sizes, prompts, options)


@pytest.mark.parametrize("name", ["sppo-qlora", "rrhf-qlora"])
def test_shipped_qlora_recipes_plan_no_lora_kernel_warning(name, mistral_sizes):
    """The shipped QLoRA recipes plan no LoRA-kernel warning, as written (all four off) and
    with the four keys deleted: POFE then turns them off (`keep_lora_kernels_off`), as the
    run will, where axolotl alone would turn them on."""
    raw = yaml.safe_load((ROOT / "recipes" / f"{name}.yml").read_text())
    unset = {k: v for k, v in raw.items() if k not in LORA_KERNELS}
    for recipe in (raw, unset):
        said = plan_of(recipe, mistral_sizes, PROMPTS, PlanOptions())["warnings"]
        assert not [w for w in said if "LoRA kernels" in w], said


def test_lora_kernels_warn_only_when_a_recipe_turns_them_on(mistral_sizes):
    unset = dict.fromkeys(LORA_KERNELS)
    said = plan_of(_recipe(**unset), mistral_sizes, PROMPTS, PlanOptions())["warnings"]
    assert not [w for w in said if "LoRA kernels" in w]  # None is unset: POFE turns them off
    off = plan_of(_recipe(**dict.fromkeys(LORA_KERNELS, False)), mistral_sizes, PROMPTS, PlanOptions())["warnings"]
    assert not [w for w in off if "LoRA kernels" in w]
    one = plan_of(
        _recipe(**{**dict.fromkeys(LORA_KERNELS, False), "lora_o_kernel": True}), mistral_sizes, PROMPTS, PlanOptions()
    )["warnings"]
    assert [w for w in one if w.startswith("LoRA kernels lora_o_kernel (set explicitly)")]


def test_a_gpu_too_small_is_named_with_the_key(mistral_sizes):
    """On a 16 GB GPU vLLM's 0.9 share (14.4 GB) cannot hold bf16 Mistral (14.5 GB) and a 32k
    sequence's KV cache (4.3 GB); training (about 7 GB) fits."""
    plan = plan_of(_recipe(), mistral_sizes, PROMPTS, PlanOptions(gpu_memory_gb=16))
    said = [w for w in plan["warnings"] if "generate" in w]
    assert len(said) == 3 and all("pofe.generate.vllm_kwargs.max_model_len" in w for w in said)
    assert not [w for w in plan["warnings"] if w.startswith("train")]
    small = plan_of(_recipe(), mistral_sizes, PROMPTS, PlanOptions(gpu_memory_gb=6))
    assert [w for w in small["warnings"] if w.startswith("train (round 1)") and "micro_batch_size" in w]


def test_disk_and_checkpoints():
    plan = {"disk_gb": 120.0, "recipe": "./outputs/x"}
    assert disk_warning(plan, 200 * GB) == []
    (said,) = disk_warning(plan, 100 * GB)
    assert "save_total_limit" in said and "100.0 GB free" in said


def test_zero3_checkpoints_without_a_limit_keep_axolotls_four(mistral_sizes):
    """Every 10 steps in a round of 313: the trainer saves at steps 10, 20, ..., 310 and at the
    last step (31 + 1 = 32 checkpoints); with no save_total_limit axolotl sets 4, so 4 of
    DeepSpeed's full state (14 bytes a parameter plus the gathered bf16 model) are kept, beside
    the bf16 model; save_total_limit 2 keeps 2. Without the prompt count the steps are unknown,
    and the limit bounds the disk."""
    raw = yaml.safe_load((ROOT / "recipes" / "sppo-zero3.yml").read_text())
    raw.update(save_steps=10, deepspeed=str(ROOT / "recipes" / "deepspeed" / "zero3_bf16.json"))
    raw.pop("save_total_limit", None)
    raw.pop("save_only_model", None)
    train = plan_of(raw, mistral_sizes, PROMPTS, PlanOptions(gpus=8))["stages"][2]
    assert train["counts"]["checkpoint_gb"] == round(16 * TOTAL / GB, 2)
    assert train["counts"]["checkpoints_saved"] == 32 and train["counts"]["checkpoints_kept"] == 4
    assert train["disk_gb"] == round((4 * 16 * TOTAL + 2 * TOTAL) / GB, 2)
    kept = plan_of({**raw, "save_total_limit": 2}, mistral_sizes, PROMPTS, PlanOptions(gpus=8))["stages"][2]
    assert kept["counts"]["checkpoints_kept"] == 2
    unknown = plan_of(raw, mistral_sizes, None, PlanOptions(gpus=8))
    train = unknown["stages"][2]
    assert train["counts"]["steps"] is None and train["counts"]["checkpoints_saved"] is None
    assert train["disk_gb"] == round((4 * 16 * TOTAL + 2 * TOTAL) / GB, 2)


def test_max_steps_overrides_the_epochs(mistral_sizes):
    """320 prompts in micro-batches of 2 x 8 accumulated: 20 steps a round. With max_steps: 100
    the trainer runs 100 (transformers loops over the data until it reaches max_steps): it saves
    at 10, 20, ..., 100, 10 checkpoints, of which axolotl's save_total_limit 4 keeps 4, or 10
    with save_total_limit 20. Each is the LoRA adapter with its two Adam moments (fp32: 12 bytes
    a parameter); the round's model is the fp32 adapter."""
    raw = _recipe(max_steps=100, save_steps=10)
    epochs = plan_of(_recipe(save_steps=10), mistral_sizes, 320, PlanOptions())["stages"][2]
    assert epochs["counts"]["steps"] == 20 and epochs["counts"]["checkpoints_saved"] == 2
    train = plan_of(raw, mistral_sizes, 320, PlanOptions())["stages"][2]
    assert train["stage"] == "train" and train["counts"]["steps"] == 100
    assert train["counts"]["checkpoints_saved"] == 10 and train["counts"]["checkpoints_kept"] == 4
    assert train["disk_gb"] == round((4 * 12 * LORA_R16 + 4 * LORA_R16) / GB, 2)
    limited = plan_of({**raw, "save_total_limit": 20}, mistral_sizes, 320, PlanOptions())["stages"][2]
    assert limited["counts"]["checkpoints_kept"] == 10
    assert limited["disk_gb"] == round((10 * 12 * LORA_R16 + 4 * LORA_R16) / GB, 2)
    # max_steps needs no prompt count
    assert plan_of(raw, mistral_sizes, None, PlanOptions())["stages"][2]["counts"]["steps"] == 100


@pytest.mark.parametrize(
    "keys, steps, saved",
    [
        # saves_per_epoch 2 over 2 epochs: axolotl's save_steps 1 / (2 x 2) of 40 steps, every 10
        ({"num_epochs": 2, "saves_per_epoch": 2}, 40, 4),
        ({"num_epochs": 3, "save_strategy": "epoch"}, 60, 3),  # 20 steps an epoch
        ({}, 20, 1),  # neither key: axolotl saves each epoch
        ({"save_strategy": "steps"}, 20, 1),  # transformers' save_steps 500: the save at the last step
        ({"max_steps": 50}, 50, 3),  # by epoch: 20 + 20 + the 10 max_steps leaves of the third
        ({"save_steps": 10, "save_first_step": True}, 20, 3),  # steps 1, 10 and 20
        ({"save_steps": 0.3}, 20, 4),  # a fraction of the steps: every ceil(6.0) = 6, and step 20
        ({"save_strategy": "no"}, 20, None),  # POFE's one forced save, removed: none kept
    ],
)
def test_checkpoints_as_the_trainer_saves_them(mistral_sizes, keys, steps, saved):
    """320 prompts, micro-batches of 2 x 8 accumulated: 20 steps an epoch; the save keys as
    axolotl hands them to transformers, each checkpoint counted where transformers writes it."""
    raw = {k: v for k, v in _recipe().items() if k not in ("save_strategy", "save_steps")} | keys
    counts = plan_of(raw, mistral_sizes, 320, PlanOptions())["stages"][2]["counts"]
    assert (counts["steps"], counts["checkpoints_saved"]) == (steps, saved)
    assert counts["checkpoints_kept"] == (0 if saved is None else min(saved, 4))


def test_a_model_not_in_the_cache_is_said(tmp_path):
    from unittest import mock

    from huggingface_hub import constants

    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(_recipe(output_dir=str(tmp_path / "out"))))
    with mock.patch.object(constants, "HF_HUB_CACHE", str(tmp_path / "empty")):
        plan = plan_recipe(recipe, PlanOptions(), prompts=PROMPTS)
    said = [w for w in plan["warnings"] if "not in the local cache" in w]
    assert [w.split(":")[0] for w in said] == ["base_model", "pofe.judge.model"]
    train = next(s for s in plan["stages"] if s["stage"] == "train")
    assert train["gpu_memory_gb"] is None and plan["disk_gb"] is None


def _tokenizer(folder: Path, adds_bos: bool) -> Path:
    """A word-level tokenizer whose chat template writes <s>, adding <s> itself or not."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "Hello"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    fast.save_pretrained(folder)
    return folder


def test_double_bos_is_warned(tmp_path):
    (said,) = [double_bos(str(_tokenizer(tmp_path / "twice", adds_bos=True)))]
    assert "two BOS" in said and "add_special_tokens" in said
    assert double_bos(str(_tokenizer(tmp_path / "once", adds_bos=False))) is None


def test_cli_json(tmp_path):
    """`axolotl pofe plan --json` through the CLI on a recipe whose models are not on disk."""
    from click.testing import CliRunner

    from pofe.cli import pofe

    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(_recipe(output_dir=str(tmp_path / "out"), base_model="nobody/not-cached")))
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(pofe, ["plan", str(recipe), "--json", "--prompts", "30", "--output", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert json.loads(out.read_text()) == plan
    assert [s["round"] for s in plan["stages"]][:4] == [1, 1, 1, 1] and plan["prompts"] == 30
    text = CliRunner().invoke(pofe, ["plan", str(recipe), "--prompts", "30"])
    assert "round 1 train" in text.output and "WARNING: base_model: nobody/not-cached is not in the" in text.output


def test_an_output_in_a_missing_folder_is_refused_before_planning(tmp_path, monkeypatch):
    """`--output no/such/dir/plan.json`: a usage error naming the folder, before the plan is made
    (it was a FileNotFoundError traceback after planning)."""
    from click.testing import CliRunner

    from pofe.cli import pofe
    from pofe.run.plan import planner

    def planned(*args, **kwargs):
        raise AssertionError("planned before the output was checked")

    monkeypatch.setattr(planner, "plan_recipe", planned)
    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(_recipe(output_dir=str(tmp_path / "out"), base_model="nobody/not-cached")))
    out = tmp_path / "no" / "such" / "plan.json"
    result = CliRunner().invoke(pofe, ["plan", str(recipe), "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for --output: the folder {out.parent} does not exist: create it, or give a file in an" in (
        " ".join(result.output.split())
    )
    assert not (tmp_path / "no").exists()


def test_a_local_base_model_that_is_not_there_is_an_error(tmp_path, monkeypatch):
    """A base_model that can only be a local path (absolute, ./relative, or a/b/c) and does not
    exist: the run could not start, so plan exits 1 saying the path is not found, naming the key
    (it said "? GB" and advised `huggingface-cli download <path>`). A folder without
    config.json is said as such."""
    from click.testing import CliRunner

    from pofe.cli import pofe

    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.yml"
    for model, said in [
        (
            str(tmp_path / "none"),
            f"local path {tmp_path / 'none'} not found: correct base_model, or name a hub model id",
        ),
        (
            "./models/none",
            f"local path ./models/none not found (as {tmp_path / 'models' / 'none'}: a relative path counts from "
            "the directory the command runs in): correct base_model, or name a hub model id",
        ),
        (str(tmp_path), f"the local directory {tmp_path} has no config.json: point base_model at the model's folder"),
    ]:
        recipe.write_text(yaml.safe_dump(_recipe(output_dir=str(tmp_path / "out"), base_model=model)))
        result = CliRunner().invoke(pofe, ["plan", str(recipe), "--prompts", "30"])
        assert result.exit_code == 1, result.output
        assert result.output.startswith(f"Error: base_model: {said}"), result.output
        assert "hf download" not in result.output


def test_a_local_judge_that_is_not_there_is_said_not_found(tmp_path, tiny_model):
    """A judge's local path that does not exist: a warning naming the key and the path (the
    plan of the policy's stages still holds), not advice to download the path from the hub."""
    raw = _recipe(output_dir=str(tmp_path / "out"), base_model=str(tiny_model))
    raw["pofe"] = {**raw["pofe"], "judge": {"type": "reward_model", "model": str(tmp_path / "rm")}}
    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(raw))
    plan = plan_recipe(recipe, PlanOptions(), prompts=30)
    said = [w for w in plan["warnings"] if w.startswith("pofe.judge.model")]
    assert said == [
        f"pofe.judge.model: local path {tmp_path / 'rm'} not found: correct pofe.judge.model, or name a hub model id"
    ]
    assert not [w for w in plan["warnings"] if "hf download" in w]
    judge = next(s for s in plan["stages"] if s["stage"] == "judge")
    assert judge["gpu_memory_gb"] is None


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("--gpu-memory", "nan", "'nan' is not a finite number."),
        ("--gpu-memory", "inf", "'inf' is not a finite number."),
        ("--gpu-memory", "0", "0.0 is not in the range x>=1."),
        ("--gpus", "0", "0 is not in the range x>=1."),
        ("--prompts", "0", "0 is not in the range x>=1."),
    ],
)
def test_plan_options_are_finite_and_positive(tmp_path, option, value, said):
    """`--gpu-memory nan` passed click's range check (nan compares false) and every stage then
    "exceeded a nan GB GPU": each option is refused by click, naming it."""
    from click.testing import CliRunner

    from pofe.cli import pofe

    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(_recipe(output_dir=str(tmp_path / "out"))))
    result = CliRunner().invoke(pofe, ["plan", str(recipe), option, value])
    assert result.exit_code == 2
    assert f"Error: Invalid value for '{option}': {said}" in result.output


def _responses_recipe(tmp_path, rows: list[dict], **pofe) -> Path:
    """rrhf-qlora on a local JSONL of `rows`, 3 samples a prompt plus the `responses` column,
    no evaluation (no held-out rows)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = yaml.safe_load((ROOT / "recipes" / "rrhf-qlora.yml").read_text())
    raw["datasets"] = [{"path": str(data), "type": "pofe.prompts"}]
    raw["output_dir"] = str(tmp_path / "out")
    generate = {"backend": "transformers", "num_candidates": 3, "include_dataset_responses": ["responses"]}
    raw["pofe"] = {**raw["pofe"], "generate": generate, "eval": False, **pofe}
    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


def test_a_list_column_of_dataset_responses_counts_each_response(tmp_path):
    """40 prompts, each with 3 dataset responses in a list column, and 3 samples: 6 candidates a
    prompt, 240 candidates and 240 reward-model calls (the list counted as one gave 160), rows of
    6 responses in training."""
    recipe = _responses_recipe(tmp_path, [{"prompt": f"q{i}", "responses": ["a", "b", "c"]} for i in range(40)])
    plan = plan_recipe(recipe, PlanOptions())
    generate, judge, train = plan["stages"][:3]
    assert (generate["counts"]["candidates"], generate["counts"]["sampled"]) == (240, 120)
    assert judge["counts"]["judge_calls"] == 240
    assert train["counts"]["responses_per_row"] == 6
    assert not [w for w in plan["warnings"] if "include_dataset_responses" in w]


def test_dataset_responses_are_counted_per_round(tmp_path):
    """Two rounds splitting 40 prompts: rows 0-19 (round 1) hold one response, a string, rows
    20-39 (round 2) a list of three. Round 1: 20 x (3 + 1) = 80 candidates; round 2:
    20 x (3 + 3) = 120."""
    rows = [{"prompt": f"q{i}", "responses": "a" if i < 20 else ["a", "b", "c"]} for i in range(40)]
    recipe = _responses_recipe(tmp_path, rows, rounds=2, round_prompts="split")
    plan = plan_recipe(recipe, PlanOptions())
    generate = [s["counts"]["candidates"] for s in plan["stages"] if s["stage"] == "generate"]
    train = [s["counts"]["responses_per_row"] for s in plan["stages"] if s["stage"] == "train"]
    assert generate == [80, 120] and train == [4, 6]


def test_dataset_responses_not_read_are_said_an_estimate(tmp_path):
    """--prompts with a dataset the plan does not read (here: a count other than the file's
    rows): one response per column and prompt, said to be an estimate."""
    recipe = _responses_recipe(tmp_path, [{"prompt": f"q{i}", "responses": ["a", "b", "c"]} for i in range(40)])
    plan = plan_recipe(recipe, PlanOptions(), prompts=50)
    assert plan["stages"][0]["counts"]["candidates"] == 50 * 4
    (said,) = [w for w in plan["warnings"] if w.startswith("pofe.generate.include_dataset_responses")]
    assert said.startswith("pofe.generate.include_dataset_responses (responses): counted as one response per")
    assert said.endswith("the candidates, judge calls and training rows' responses are an estimate")


@pytest.mark.e2e
def test_plan_says_which_command_it_planned_and_on_what_machine(tiny_model, tmp_path):
    """Issue 49: `axolotl pofe plan` of tiny-rrhf-cpu.yml planned `axolotl pofe run`'s round (48
    prompts: the run's default held-out slice) where the recipe is trained with `axolotl train`,
    and printed "1 x 80 GB" for a CPU recipe. The recipe sets no pofe.rounds: planned as `axolotl
    train`, its 60 prompts (no pofe.eval.held_out: every row trains) in micro-batches of 20 for 50
    epochs, 150 steps, then `axolotl pofe eval` (whose missing held-out prompts are warned); on the
    CPU, no GPU named. `--command run --device cuda` plans the run's rounds on a GPU it says it
    assumed where this machine has none."""
    import torch

    from pofe.demo.task import make_prompt_rows, write_jsonl

    raw = yaml.safe_load((ROOT / "recipes" / "tiny-rrhf-cpu.yml").read_text())
    data = write_jsonl(make_prompt_rows(60), tmp_path / "prompts.jsonl")
    raw |= {"base_model": str(tiny_model), "output_dir": str(tmp_path / "out")}
    raw["datasets"] = [{**raw["datasets"][0], "path": str(data)}]
    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(raw))
    console = run_axolotl("pofe", "plan", str(recipe)).stdout
    lines = console[console.index("planned: ") :].splitlines()
    assert lines[:2] == [
        f"planned: axolotl train {recipe} (rrhf, 60 prompts, 150 steps), then axolotl pofe eval {recipe} (the "
        "recipe sets no pofe.rounds; --command run plans axolotl pofe run's rounds)",
        "on: the CPU, memory is the process's resident set (device cpu: the recipe sets bf16: false, as a CPU "
        "recipe does; --device cuda to plan it otherwise)",
    ]
    assert "GB GPU" not in console and "round 1" not in console and "merge" not in console
    assert "WARNING: pofe.eval.held_out is not set: `axolotl train` trains on every row" in console
    console = run_axolotl("pofe", "plan", str(recipe), "--command", "run", "--device", "cuda").stdout
    lines = console[console.index("planned: ") :].splitlines()
    assert lines[0] == f"planned: axolotl pofe run {recipe} (rrhf, 1 round(s), 60 prompts) (asked with --command)"
    if not torch.cuda.is_available():
        assert lines[1] == (
            "on: 1 x 80 GB GPU (assumed: this machine has no GPU; --gpus and --gpu-memory say yours; device cuda)"
        )


@pytest.mark.parametrize("name", ["tiny-rrhf-cpu", "tiny-sppo-cpu", "tiny-sppo-verifier-cpu"])
def test_tiny_recipes_plan_on_the_cpu(name, tiny_model, tmp_path):
    """The CPU recipes on the tests' tiny Llama: every stage sized, in float32, on the CPU; the
    training estimate (the process, 0.8 GB, plus a model of kilobytes) is within a factor 1.5
    of the 0.85 GiB peak measured for `axolotl train` on such a model (docs: shared environment
    notes; tests/test_rounds_e2e.py checks the evaluation's against a measured peak)."""
    from pofe.args import pofe_config
    from pofe.demo.task import make_prompt_rows, write_jsonl

    raw = yaml.safe_load((ROOT / "recipes" / f"{name}.yml").read_text())
    raw["base_model"] = str(tiny_model)
    sizes, warnings = model_sizes(raw, pofe_config(raw))
    assert warnings == []
    # the demo's prompts: an answer and a list of 3 near misses each, 4 dataset responses a row
    rows = prompt_rows(
        {"datasets": [{"path": str(write_jsonl(make_prompt_rows(60), tmp_path / "p.jsonl"))}]},
        ["answer", "near_misses"],
    )
    assert rows == (60, [4] * 60)
    plan = plan_run(*translated_recipe(raw), sizes, 60, PlanOptions(device="cpu"), rows[1])
    generate = plan["stages"][0]
    assert generate["counts"]["candidates"] == generate["counts"]["prompts"] * (
        raw["pofe"]["generate"]["num_candidates"] + 4
    )
    for s in plan["stages"]:
        assert s["gpu_memory_gb"] == 0.0 and s["device"] == "cpu", s
        assert s["cpu_memory_gb"] is not None or not s["parts_gb"], s
    train = next(s for s in plan["stages"] if s["stage"] == "train")
    assert train["dtype"] == "float32" and train["disk_gb"] == round(sizes[str(tiny_model)].total * 4 / GB, 2)
    assert 1 / 1.5 <= train["cpu_memory_gb"] / (0.85 * 2**30 / GB) <= 1.5
    assert plan["warnings"] == []  # no LoRA, full fine-tuning; the kernels stay off


def test_workers_sharing_a_gpu_add_up(mistral_sizes):
    """Two candidate workers placed on GPU 0: two vLLM engines (each taking 0.9 of it) and two
    PairRM judges there; on 2 GPUs, one each."""
    shared = _recipe()
    shared["pofe"] = {
        **shared["pofe"],
        "candidates": {**shared["pofe"]["candidates"], "num_workers": 2, "worker_devices": ["0", "0"]},
    }
    plan = plan_of(shared, mistral_sizes, PROMPTS, PlanOptions(gpus=2))
    generate, judge = plan["stages"][0], plan["stages"][1]
    assert generate["gpu_memory_gb"] == 2 * 72.0 and generate["data_parallel"] == 2
    assert abs(judge["parts_gb"]["1_more_workers_on_this_gpu"] - judge["gpu_memory_gb"] / 2) <= 0.01  # GB rounding
    assert [w for w in plan["warnings"] if w.startswith("generate (round 1)") and "worker_devices" in w]
    apart = {
        **shared,
        "pofe": {**shared["pofe"], "candidates": {**shared["pofe"]["candidates"], "worker_devices": None}},
    }
    spread = plan_of(apart, mistral_sizes, PROMPTS, PlanOptions(gpus=2))
    assert spread["stages"][0]["gpu_memory_gb"] == 72.0 and not [w for w in spread["warnings"] if "generate" in w]


def test_a_reward_model_judge_counts_its_shared_prompt_keys(mistral_sizes):
    """With judge.prefix_sharing (judges/shared_prefix.py) a reward model keeps a window's prompt
    keys and values and one batch's gathered copy: 2 x (2 x 32 layers x 1024 kv width x 2 bytes,
    bfloat16) x batch_size 8 x max_length 1024 = 2 GiB; without it, nothing."""
    base = _recipe()
    judge = {
        "type": "reward_model",
        "model": "mistralai/Mistral-7B-Instruct-v0.2",
        "batch_size": 8,
        "max_length": 1024,
    }
    stages = {}
    for sharing in (True, False):
        raw = {**base, "pofe": {**base["pofe"], "judge": {**judge, "prefix_sharing": sharing}}}
        stages[sharing] = plan_of(raw, mistral_sizes, PROMPTS, PlanOptions())["stages"][1]
    expected = 2 * (2 * 32 * 1024 * 2) * 8 * 1024 / GB
    assert stages[True]["stage"] == "judge" and stages[True]["parts_gb"]["prefix_kv"] == round(expected, 2)
    assert "prefix_kv" not in stages[False]["parts_gb"]
    assert abs(stages[True]["gpu_memory_gb"] - stages[False]["gpu_memory_gb"] - expected) <= 0.01  # GB rounding


def test_anchor_mix_plans_pi_0s_pass_in_rounds_2_on(mistral_sizes):
    """sppo-qlora with pofe.anchor_mix: rounds 2 and 3 load pi_0 (the base model, NF4 like the
    policy) in their preprocess stage, after the judge; round 1 does not (its pi_t is pi_0). Its
    memory by hand: the NF4 weights of test_qlora_training_memory_is_the_hand_computed_one, one
    layer's bfloat16 values for micro_batch_size 2 rows x 2 responses (best_worst) x 1024 tokens,
    one chunk of fp32 logits (1024 x 32000) and the runtime."""
    raw = _recipe()
    raw["pofe"] = {**raw["pofe"], "anchor_mix": 0.1}
    plan = plan_of(raw, mistral_sizes, PROMPTS, PlanOptions())
    names = [(s["stage"], s["round"]) for s in plan["stages"] if s["round"] is not None]
    assert ("pi_0", 1) not in names
    for t in (2, 3):
        assert names.index(("pi_0", t)) == names.index(("judge", t)) + 1
    entry = next(s for s in plan["stages"] if s["stage"] == "pi_0")
    assert entry["model"] == "mistralai/Mistral-7B-Instruct-v0.2" and entry["quantization"] == "nf4"
    nf4 = LAYER_LINEAR * (0.5 + 1 / 64 + 4 / (64 * 256)) + OTHER * 2
    layer = 2 * 2 * 1024 * (9 * 4096 + 2 * 1024 + 4 * 14336) * 2
    expected = (nf4 + layer + 1024 * 32000 * 4 + 0.5 * GB) / GB
    assert abs(entry["gpu_memory_gb"] - expected) <= 0.01  # GB rounding
    plain = plan_of(_recipe(), mistral_sizes, PROMPTS, PlanOptions())
    assert not [s for s in plain["stages"] if s["stage"] == "pi_0"]


@pytest.mark.parametrize(
    "name, overrides, device",
    [("tiny-rrhf-cpu", {}, "cpu"), ("tiny-sppo-cpu", {}, "cpu"), ("tiny-rrhf-cpu", {"bf16": "auto"}, "cuda")],
)
def test_the_device_is_the_recipes_unless_told(tmp_path, tiny_model, name, overrides, device):
    """Without --device, a CPU recipe (bf16: false) is planned on the CPU, in float32, and says
    why; the same recipe with bf16: auto is a GPU one. --device wins over the recipe."""
    from pofe.run.plan.render import render_text

    raw = {**yaml.safe_load((ROOT / "recipes" / f"{name}.yml").read_text()), **overrides}
    raw |= {"base_model": str(tiny_model), "output_dir": str(tmp_path / "out")}
    recipe = tmp_path / "r.yml"
    recipe.write_text(yaml.safe_dump(raw))
    plan = plan_recipe(recipe, PlanOptions(device=None), prompts=60)
    assert plan["device"] == device and {s["device"] for s in plan["stages"] if s["parts_gb"]} == {device}
    train = next(s for s in plan["stages"] if s["stage"] == "train")
    assert train["dtype"] == ("float32" if device == "cpu" else "bfloat16")
    machine = render_text(plan).splitlines()[1]
    if device == "cpu":
        assert machine == (
            "on: the CPU, memory is the process's resident set (device cpu: the recipe sets bf16: false, as a CPU "
            "recipe does; --device cuda to plan it otherwise)"
        )
    told = plan_recipe(recipe, PlanOptions(device="cuda"), prompts=60)
    assert told["device"] == "cuda" and told["device_from"] == "--device"


def test_a_gpm_judge_is_sized_as_its_backbone_and_called_once_a_candidate(tmp_path, tiny_model):
    """GPM embeds each candidate once: 10 prompts x K = 3 are 30 judge calls, where PairRM judges
    the 10 x 3 x 2 = 60 ordered pairs. The plan sizes GPM's backbone alone, the language-model
    head not being loaded: the tiny Llama (vocabulary 103, width 32, two layers, two key-value
    heads of 16) has embeddings 103 x 32 = 3296, per layer q, k, v, o 4 x 32 x 32 = 4096, gate and
    up 2 x 32 x 64 and down 64 x 32 = 6144 and two norms of 32, and a final norm of 32:
    3296 + 2 x 10304 + 32 = 23936 parameters (with the head, 3296 more)."""
    from pofe.args import pofe_config
    from tests.candidates.gpm_checkpoint import write_gpm_checkpoint
    from tests.helpers import write_rounds_recipe

    gpm = write_gpm_checkpoint(tmp_path / "gpm", hidden=32)
    raw = yaml.safe_load(write_rounds_recipe(tmp_path, tiny_model, "sppo", eval_keys=False).read_text())
    raw["pofe"] |= {"rounds": 1, "eval": False, "judge": {"type": "gpm", "model": str(gpm)}}
    raw["pofe"]["generate"]["include_dataset_responses"] = []
    sizes, warnings = model_sizes(raw, pofe_config(raw))
    assert warnings == [] and sizes[str(gpm)].total == 23936
    plan = plan_run(*translated_recipe(raw), sizes, 10, PlanOptions(device="cpu"))
    (judge,) = [s for s in plan["stages"] if s["stage"] == "judge"]
    assert judge["counts"]["judge_calls"] == 30 and judge["counts"]["pairwise"]
    raw["pofe"]["judge"] = {"type": "pairrm", "model": str(gpm)}  # counted, not sized
    (pairrm,) = [
        s for s in plan_run(*translated_recipe(raw), {}, 10, PlanOptions())["stages"] if s["stage"] == "judge"
    ]
    assert pairrm["counts"]["judge_calls"] == 60


# ---- issue 44: each stage costed on its backend; the README's claims are the plan's -------------


def test_readme_claims_are_what_plan_fits():
    """Every shipped GPU recipe plans no stage over its GPUs at the smallest and the largest GPU the
    README's recipe table gives it, and the table says so (`benchmarks.plan_table.CLAIMS`).
    Before: eval-answers was costed as model.generate (40.75 GB) where vLLM samples, and the online
    recipe, claimed for 24 GB with the others, plans 37.06 GB."""
    readme = (ROOT / "README.md").read_text().splitlines()
    claimed = claim_plans()
    for (name, memory), plan in claimed.items():
        assert over_the_gpu(plan) == [], (name, memory)
        row = next(line for line in readme if line.startswith("| ") and f"`{name}`" in line.split(" | ")[0])
        assert claim_text(*CLAIMS[name]) in row, (name, row)
    online = next(s for s in claimed[("rrhf-qlora-online.yml", 40)]["stages"] if s["stage"] == "train")
    assert 24 < online["gpu_memory_gb"] <= 40  # why its claim starts at 40 GB


def test_evaluation_is_costed_on_the_backend_it_uses(mistral_sizes):
    """sppo-qlora generates with vLLM, so `pofe.eval.backend: auto` samples on it: eval-answers is
    the engine's share (as generate's), then eval-logprobs holds the bf16 weights and one no-grad
    forward of 16 answers (pofe.eval.batch_size) of sequence_len 1024 + 500 new tokens: one layer's
    values (9 x 4096 + 2 x 1024 + 4 x 14336 = 96,256 a token, 2 bytes) x 16 x 1524 tokens
    = 4.694 GB, plus a 1024-token chunk of fp32 logits (1024 x 32000 x 4 = 0.131 GB).
    `backend: transformers` costs model.generate instead (no eval-logprobs)."""
    plan = plan_of(_recipe(), mistral_sizes, PROMPTS, PlanOptions(gpu_memory_gb=24))
    stages = {s["stage"]: s for s in plan["stages"] if s["round"] is None}
    assert (
        stages["eval-answers"]["parts_gb"] == next(s for s in plan["stages"] if s["stage"] == "generate")["parts_gb"]
    )
    forward = 96_256 * 2 * 16 * (1024 + 500) + 1024 * 32000 * 4
    assert stages["eval-logprobs"]["parts_gb"]["forward"] == round(forward / GB, 2) == 4.83
    assert not over_the_gpu(plan)
    raw = _recipe()
    raw["pofe"] = {**raw["pofe"], "eval": {"backend": "transformers"}}
    generate = {s["stage"]: s for s in plan_of(raw, mistral_sizes, PROMPTS, PlanOptions())["stages"]}
    assert "kv_cache" in generate["eval-answers"]["parts_gb"] and "eval-logprobs" not in generate


def test_gpus_reach_the_candidate_stages_or_are_warned(mistral_sizes):
    """`sppo-zero3.yml --gpus 1`: its worker_devices name GPUs 0-7, which one GPU has not: warned
    (generation was shown "on 8 GPU" without a word). Without worker_devices, its 8 workers share
    the one GPU: the stage is on 1 GPU with 7 more engines there."""
    raw = yaml.safe_load((ROOT / "recipes" / "sppo-zero3.yml").read_text())
    plan = plan_of(raw, mistral_sizes, PROMPTS, PlanOptions(gpus=1))
    said = [w for w in plan["warnings"] if w.startswith("pofe.candidates.worker_devices")]
    assert len(said) == 1 and "names GPU(s) 1, 2, 3, 4, 5, 6, 7, which --gpus 1 (GPU 0) has not" in said[0]
    assert not [w for w in plan_of(raw, mistral_sizes, PROMPTS, PlanOptions(gpus=8))["warnings"] if "worker" in w]
    raw["pofe"]["candidates"]["worker_devices"] = None
    spread = plan_of(raw, mistral_sizes, PROMPTS, PlanOptions(gpus=1))
    generate = spread["stages"][0]
    assert generate["gpus"] == 1 and "7_more_workers_on_this_gpu" in generate["parts_gb"]
    assert not [w for w in spread["warnings"] if w.startswith("pofe.candidates")]


def test_a_generation_longer_than_training_room_is_warned(mistral_sizes):
    """The authors' 2048 new tokens under sequence_len 1024 (the recipes before issue 44): a
    512-token prompt leaves 512, so longer candidates are cut in training; the shipped recipes (500
    new tokens) plan no such warning."""
    from pofe.length_policy import generation_fit_warning

    raw = _recipe()
    raw["pofe"] = {**raw["pofe"], "generate": {**raw["pofe"]["generate"], "max_new_tokens": 2048}}
    said = [w for w in plan_of(raw, mistral_sizes, PROMPTS, PlanOptions())["warnings"] if "does not fit" in w]
    assert said == [generation_fit_warning(1024, 2048, None)]
    assert "Lower max_new_tokens to 512 or less" in said[0] and "raise sequence_len to 2560" in said[0]
    assert "trained cut to fit (pofe.truncation: truncate)" in said[0]
    assert not [w for w in plan_of(_recipe(), mistral_sizes, PROMPTS, PlanOptions())["warnings"] if "fit" in w]
    from pofe.args.lengths import generation_fit

    for path in sorted((ROOT / "recipes").glob("*.yml")):  # every shipped recipe's candidates train whole
        if path.stem == "tiny-sft-cpu":  # plain axolotl: no candidates
            continue
        assert generation_fit(*translated_recipe(yaml.safe_load(path.read_text()))) is None, path.name
    # the prompt's bound: max_prompt_len, or the generation's max_prompt_tokens when lower
    assert generation_fit_warning(1024, 600, 400) is None
    assert generation_fit_warning(1024, 600, None, max_prompt_tokens=300) is None
    assert "dropped (pofe.truncation: drop)" in generation_fit_warning(1024, 600, None, truncation="drop")


def test_the_recipe_read_warns_a_generation_longer_than_training_room(caplog):
    """The same warning when axolotl reads the recipe (`PofePlugin.register`: every `axolotl
    preprocess`, `train` and each stage of `pofe run`), not only in a plan."""
    from pofe.plugin import LOG, PofePlugin

    raw = _recipe()
    raw["pofe"] = {**raw["pofe"], "generate": {**raw["pofe"]["generate"], "max_new_tokens": 2048}}
    LOG.logger.addHandler(caplog.handler)
    try:
        PofePlugin().register(raw)
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert "POFE: pofe.generate.max_new_tokens (2048) does not fit sequence_len (1024)" in caplog.text
