"""Every shipped recipe loads and passes axolotl's validation with the plugin."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from axolotl.cli.config import prepare_plugins
from axolotl.utils.config import validate_config
from axolotl.utils.dict import DictDefault

from pofe.args.translate import LORA_KERNELS
from tests.helpers import H100, ROOT, validated_recipe

RECIPES = sorted((ROOT / "recipes").glob("*.yml"))
# plain axolotl, no POFE: the supervised fine-tune the Nash-MD toy recipe starts from (its pi_0)
SFT = ROOT / "recipes" / "tiny-sft-cpu.yml"
CPU = {"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}


def test_recipes_exist_for_each_method_and_setup():
    names = {p.stem for p in RECIPES}
    for method in ("rrhf", "sppo"):
        assert {f"{method}-qlora", f"{method}-zero3", f"tiny-{method}-cpu"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates(path):
    raw = yaml.safe_load(path.read_text())
    method = raw.get("rl")
    assert (method is None) == (path == SFT)
    cfg = DictDefault(raw)
    prepare_plugins(cfg)
    caps = CPU if path.stem.startswith("tiny-") else H100
    cfg = validate_config(cfg, capabilities=caps, env_capabilities={"torch_version": "2.13.0"})
    assert cfg.rl is None and (cfg.pofe.method == method if method else cfg.pofe is None)
    assert cfg.sample_packing is False
    if path.stem.endswith("qlora"):
        assert cfg.adapter == "qlora" and cfg.load_in_4bit
    if path.stem.endswith("zero3"):
        ds = json.loads((path.parents[1] / cfg.deepspeed).read_text())
        assert ds["zero_optimization"]["stage"] == 3
        assert cfg.adapter is None  # full fine-tuning


def test_each_recipe_trains_into_an_output_dir_named_after_it():
    """Issue 49: the tiny recipes trained into outputs/demo/<method>, so a newcomer's copy of one wrote
    into the demo's folder. Each recipe's output_dir is outputs/<its name>: none shared, none the
    demo's (the demo's own files, the toy's model and prompts, stay in outputs/demo)."""
    output_dirs = {path.stem: Path(yaml.safe_load(path.read_text())["output_dir"]) for path in RECIPES}
    assert output_dirs == {path.stem: Path("outputs") / path.stem for path in RECIPES}


def test_pofe_keys_at_the_top_level_are_refused_not_dropped():
    """`rank_weight: 5.0` and `margin: 0.5` beside axolotl's keys, as axolotl validates the recipe:
    an error naming each key and where it goes (axolotl ignores keys it does not know, and the
    run trained at the defaults 1.0 and 0.0). `max_prompt_len`, a key axolotl has too, stays axolotl's."""
    raw = yaml.safe_load((RECIPES[0].parent / "tiny-rrhf-cpu.yml").read_text())
    cfg = DictDefault(raw)
    prepare_plugins(cfg)  # registers the plugin (whose hook refuses them too: below)
    cfg.update(rank_weight=5.0, margin=0.5, max_prompt_len=64)
    with pytest.raises(ValueError) as refused:
        validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"})
    assert (
        "`rank_weight: 5.0` -> `pofe.rank_weight`, `margin: 0.5` -> `pofe.margin`: POFE's keys go under `pofe:`; "
        "at the recipe's top level axolotl drops them unread. Move them into the `pofe:` block."
    ) in str(refused.value)
    # axolotl's load_cfg registers the plugin before it validates: the same message, without the recipe
    from pofe import PofePlugin

    with pytest.raises(ValueError) as registered:
        PofePlugin().register({**raw, "rank_weight": 5.0, "margin": 0.5})
    assert str(registered.value).startswith(
        "`rank_weight: 5.0` -> `pofe.rank_weight`, `margin: 0.5` -> `pofe.margin`: "
    )
    assert "Move them into the `pofe:` block." in str(registered.value)


def test_verifier_recipe_gives_sharp_preferences_on_all_k_samples():
    """SPPO on a verifier: hard preferences, every sample kept (the method's dedupe default)."""
    from pofe.args import pofe_config

    cfg = DictDefault(yaml.safe_load((RECIPES[0].parent / "tiny-sppo-verifier-cpu.yml").read_text()))
    prepare_plugins(cfg)
    pofe = pofe_config(validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"}))
    assert pofe.method == "sppo" and pofe.judge.type == "python" and pofe.judge.preferences == "hard"
    assert pofe.generate.dedupe is None and pofe.generate.for_method("sppo").dedupe is False


@pytest.mark.parametrize("name", ["rrhf-qlora", "rrhf-zero3"])
def test_rrhf_recipes_run_the_papers_pipeline_on_hh(name):
    """HH prompts read as chat turns (the `prompt_format` key survives axolotl's dataset
    schema), 4 samples plus the dataset's chosen and rejected responses, a reward model."""
    from pofe.args import pofe_config

    cfg = DictDefault(yaml.safe_load((RECIPES[0].parent / f"{name}.yml").read_text()))
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=H100, env_capabilities={"torch_version": "2.13.0"})
    pofe = pofe_config(cfg)
    assert cfg.datasets[0].type == "pofe.prompts"
    assert pofe.dataset_fields == [{"prompt_format": "hh"}]
    # the released RRHF script's sampler: diverse beam search, 4 groups, Hamming penalty 1.0
    gen = pofe.generate
    assert gen.num_candidates == 4 and gen.strategy == "diverse_beam" and gen.backend == "transformers"
    assert gen.num_beam_groups == 4 and gen.diversity_penalty == 1.0
    assert pofe.generate.include_dataset_responses == ["chosen", "rejected"]
    assert pofe.judge.type == "reward_model" and pofe.judge.model.count("/") == 1  # a hub id


def test_iterated_rounds_keep_the_prompt_format(tmp_path):
    """`axolotl pofe run` writes each round's recipe from the user's: HH prompts stay HH."""
    from pofe.run.folder import RunFolder
    from pofe.run.rounds.round_recipe import round_recipe

    raw = yaml.safe_load((RECIPES[0].parent / "rrhf-qlora.yml").read_text())
    recipe, _ = round_recipe(raw, RunFolder(tmp_path), 2, "/m/round-1", seed=1)
    (entry,) = recipe["datasets"]
    assert entry["prompt_format"] == "hh" and entry["type"] == "pofe.prompts"


def _raw(name: str) -> dict:
    return yaml.safe_load((RECIPES[0].parent / f"{name}.yml").read_text())


@pytest.mark.parametrize("name", ["rrhf-qlora", "sppo-qlora", "nash-md-qlora-online"])
def test_qlora_recipes_state_the_lora_kernels_off(name):
    raw = _raw(name)
    assert {k: raw[k] for k in LORA_KERNELS} == dict.fromkeys(LORA_KERNELS, False)
    cfg = validated_recipe(raw)
    assert not any(cfg[k] for k in LORA_KERNELS)


def test_a_lora_recipe_without_kernel_keys_keeps_them_off_and_an_explicit_one_stays():
    """axolotl turns the kernels on for LoRA unless `rl` is set; POFE removes `rl`, so it keeps
    them off itself, as axolotl does for its own RL trainers; a recipe's own choice stands."""
    raw = {k: v for k, v in _raw("sppo-qlora").items() if k not in LORA_KERNELS}
    cfg = validated_recipe(dict(raw))
    assert [cfg[k] for k in LORA_KERNELS] == [False] * 4
    chosen = validated_recipe({**raw, "lora_mlp_kernel": True})
    assert chosen.lora_mlp_kernel is True and not any(chosen[k] for k in LORA_KERNELS[1:])
    # without POFE (plain SFT), the same keys come back on: the behaviour POFE stops
    sft = {k: v for k, v in raw.items() if k not in ("rl", "pofe", "plugins")}
    sft["datasets"] = [{"path": "x.jsonl", "type": "alpaca"}]
    assert all(validated_recipe(sft)[k] for k in LORA_KERNELS)


def test_the_zero3_recipes_bound_their_checkpoints_and_use_every_gpu():
    for name in ("rrhf-zero3", "sppo-zero3"):
        cfg = validated_recipe(_raw(name))
        # one full checkpoint (a ZeRO-3 7-8B one with its optimiser state is over 100 GB), and a
        # resumable one: DeepSpeed resumes only from its own optimiser state
        assert cfg.save_total_limit == 1 and cfg.save_only_model is False
        from pofe.args import pofe_config

        candidates = pofe_config(cfg).candidates
        assert candidates.num_workers == 8 and candidates.worker_devices == [str(i) for i in range(8)]


def test_recipe_facts_the_papers_fix():
    from pofe.args import pofe_config
    from pofe.args.rounds import RoundPromptSet

    assert not any("flash_attention" in _raw(p.stem) for p in RECIPES)  # deprecated: attn_implementation
    assert all(_raw(p.stem).get("attn_implementation") for p in RECIPES)
    # QLoRA at 10x the full fine-tuning rate, for both methods
    assert _raw("rrhf-qlora")["learning_rate"] == pytest.approx(10 * _raw("rrhf-zero3")["learning_rate"])
    assert _raw("sppo-qlora")["learning_rate"] == pytest.approx(10 * _raw("sppo-zero3")["learning_rate"])
    assert validated_recipe(_raw("sppo-qlora")).merge_method == "legacy"  # 3 rounds: no NF4 round trips
    for name in ("sppo-qlora", "sppo-zero3"):
        pofe = pofe_config(validated_recipe(_raw(name)))
        assert pofe.rounds == 3 and pofe.round_prompts == [
            RoundPromptSet(path=f"UCLA-AGI/data-mistral-7b-instruct-sppo-iter{t}", split="train") for t in (1, 2, 3)
        ]


def test_the_readme_recipe_table_lists_every_recipe():
    """Issue 34: `tiny-sppo-verifier-cpu.yml` was in recipes/ but not in the README's table."""
    import re

    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("| recipe | what |")
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append(line.split("|")[1])
    listed = {name for cell in table for name in re.findall(r"`([\w.-]+\.yml)`", cell)}
    assert {p.name for p in RECIPES} <= listed, sorted({p.name for p in RECIPES} - listed)


def test_the_online_gpu_recipe_is_the_offline_one_with_the_papers_online_settings():
    """`rrhf-qlora-online.yml` is `rrhf-qlora.yml` with the RRHF paper's online variant (resample
    every 32 steps, KL penalty 0.01), the monitors (held-out prompts' chosen responses as
    references) and its own folders; nothing else may drift apart."""
    online, offline = _raw("rrhf-qlora-online"), _raw("rrhf-qlora")
    assert online["pofe"].pop("online") == {"refresh_every": 32, "kl_coef": 0.01, "monitor_every": 1}
    assert online["pofe"].pop("eval") == {"held_out": 128, "reference_column": "chosen"}
    assert online.pop("output_dir") == "./outputs/rrhf-qlora-online" != offline.pop("output_dir")
    assert online.pop("dataset_prepared_path") != offline.pop("dataset_prepared_path")
    assert online == offline


def _tiny_recipe_counts(text: str, raw: dict) -> dict[str, int]:
    """What a tiny recipe trains on and for how long, as POFE counts it: the demo's prompts (its
    default, or the `--prompts N` the recipe's comment runs it with), the held-out ones and each
    round's (`pofe.run.prompts`), an epoch's and a round's optimizer steps (`pofe.run.plan.estimate`),
    an online run's refreshes."""
    from pofe.demo.stages import NUM_TRAIN_PROMPTS
    from pofe.run.plan.estimate import steps_per_epoch, steps_per_round
    from pofe.run.prompts import held_out_count, resolve_round_prompts, split_prompts

    pofe = raw.get("pofe") or {}
    given = re.search(r"--prompts (\d+)", text)
    pool = int(given[1]) if given else NUM_TRAIN_PROMPTS
    rounds = pofe.get("rounds")
    held = held_out_count(pool, (pofe.get("eval") or {}).get("held_out"), False) if rounds else 0
    mode = resolve_round_prompts(raw["rl"], pofe.get("round_prompts", "auto")) if rounds else "all"
    per_round = len(split_prompts(pool - held, rounds or 1, mode)[0])
    batch = (raw["micro_batch_size"], raw["gradient_accumulation_steps"], 1)
    steps = steps_per_round(per_round, *batch, raw["num_epochs"], raw.get("max_steps"))
    refresh_every = (pofe.get("online") or {}).get("refresh_every")
    return {
        "pool": pool,
        "held": held,
        "per_round": per_round,
        "kept": pool - held,
        "epoch_steps": steps_per_epoch(per_round, *batch),
        "batch": raw["micro_batch_size"] * raw["gradient_accumulation_steps"],
        "steps": steps,
        "refreshes": math.ceil(steps / refresh_every) if refresh_every else None,
    }


# a comment's claim, and the count it states
CLAIMS = {
    r"(\d+) prompts in \d+ steps of \d+": "per_round",
    r"\d+ prompts in (\d+) steps of \d+": "epoch_steps",
    r"\d+ prompts in \d+ steps of (\d+)": "batch",
    r"a round is (\d+) steps": "steps",
    r"^num_epochs: \d+ +# (\d+) steps": "steps",
    r"^num_epochs: \d+ +# (\d+) refreshes": "refreshes",
    r"each on[\s#]+(\d+) new prompts": "per_round",
    r"on (\d+) held-out prompts": "held",
    r"here (\d+) of the \d+ kept for training": "per_round",
    r"here \d+ of the (\d+) kept for training": "kept",
    r"writes the tiny model and (\d+) prompts": "pool",
}


@pytest.mark.parametrize("path", [p for p in RECIPES if p.stem.startswith("tiny-")], ids=lambda p: p.stem)
def test_a_tiny_recipes_comments_count_prompts_and_steps_as_it_trains(path):
    """The numbers of prompts, steps and refreshes a tiny recipe's comments state are what it
    trains on the demo's prompts (issue 49: tiny-sppo-verifier-cpu.yml said "a round is 20
    steps", and its rounds run 100)."""
    text = path.read_text()
    counts = _tiny_recipe_counts(text, yaml.safe_load(text))
    stated = [(claim, key, int(n)) for claim, key in CLAIMS.items() for n in re.findall(claim, text, re.M)]
    wrong = [f"{claim!r}: {n}, runs {counts[key]}" for claim, key, n in stated if n != counts[key]]
    assert not wrong, counts
