"""The `pofe:` block, the `rl:` translation and config errors."""

from __future__ import annotations

import math
import typing

import pytest
import yaml
from pydantic import ValidationError

from pofe.args import PofeArgs, PofeConfig, pofe_config
from pofe.args.online import OnlineConfig
from pofe.args.translate import translate_raw_config
from pofe.demo.stages import prepare
from tests.helpers import ROOT, run_axolotl


def test_rl_moves_under_pofe_with_dataset_fields():
    cfg = {
        "rl": "sppo",
        "datasets": [
            {"path": "a.jsonl", "type": "pofe.sppo", "field_prompt": "q"},
            {"path": "b.jsonl", "type": "pofe.pairs"},
        ],
    }
    translate_raw_config(cfg)
    assert "rl" not in cfg
    assert cfg["pofe"]["method"] == "sppo"
    assert cfg["pofe"]["dataset_fields"] == [{"field_prompt": "q"}, {}]
    assert translate_raw_config(dict(cfg)) == cfg  # idempotent


def test_defaults_are_the_papers():
    c = PofeConfig()
    assert (c.rank_weight, c.margin, c.length_penalty, c.eta) == (1.0, 0.0, 1.0, 1000.0)


def test_other_rl_values_are_left_to_axolotl():
    cfg = {"rl": "dpo", "datasets": []}
    translate_raw_config(cfg)
    assert cfg == {"rl": "dpo", "datasets": []}


def test_unknown_rl_names_both_vocabularies():
    with pytest.raises(
        ValueError,
        match=r"unknown `rl: rrfh`: POFE adds \['rrhf', 'sppo', 'nash_md'\]; axolotl itself knows \[.*'dpo'",
    ):
        translate_raw_config({"rl": "rrfh"})


def test_dataset_type_must_feed_the_method():
    with pytest.raises(ValidationError, match=r"datasets\[0\] \(s.jsonl\): type pofe.sppo feeds sppo, not `rl: rrhf`"):
        PofeArgs.model_validate({"rl": "rrhf", "datasets": [{"path": "s.jsonl", "type": "pofe.sppo"}]})
    with pytest.raises(
        ValidationError,
        match=r"type 'alpaca' is not a POFE dataset type; with `rl: sppo` use one of \['pofe.prompts', 'pofe.pairs', 'pofe.sppo', 'pofe.sppo_ucla'\]",
    ):
        PofeArgs.model_validate({"rl": "sppo", "datasets": [{"path": "x", "type": "alpaca"}]})


def test_bounds_and_cross_field_rules():
    with pytest.raises(ValidationError, match="eta"):
        PofeConfig(eta=0)
    with pytest.raises(ValidationError, match="margin"):
        PofeConfig(margin=-1)
    with pytest.raises(ValidationError, match="sppo_loss: hard applies to `rl: sppo` only"):
        PofeConfig(method="rrhf", sppo_loss="hard")
    # a key only another method reads would do nothing: refused away from its default
    with pytest.raises(ValidationError, match="pofe.rank_weight: 2.0 applies to `rl: rrhf` only"):
        PofeConfig(method="sppo", rank_weight=2.0)
    with pytest.raises(ValidationError, match="pofe.eta: 5.0 applies to `rl: sppo` only"):
        PofeConfig(method="rrhf", eta=5.0)
    assert PofeConfig(method="rrhf", eta=1000.0, rank_weight=2.0).rank_weight == 2.0  # eta at its default
    with pytest.raises(ValidationError, match=r"unknown POFE method 'dpo'; known: \['nash_md', 'rrhf', 'sppo'\]"):
        PofeConfig(method="dpo")
    with pytest.raises(ValidationError, match=r"unknown key 'rank_wieght' \(did you mean 'rank_weight'\?\)"):
        PofeConfig(rank_wieght=2.0)


def _blocks(model, prefix):
    """Each config block under `model` (itself first) with its dotted key."""
    yield prefix, model
    for name, field in model.model_fields.items():
        for sub in typing.get_args(field.annotation) or (field.annotation,):
            if hasattr(sub, "model_fields"):
                yield from _blocks(sub, f"{prefix}.{name}")


def _holds_floats(annotation) -> bool:
    return annotation is float or any(map(_holds_floats, typing.get_args(annotation)))


def test_every_float_key_refuses_infinity_and_nan_with_its_value_and_range():
    """pydantic's floats take .inf and .nan, and infinity passes a `ge` bound (`online.kl_coef: .inf`
    validated, then the first step's loss went NaN): every float key of every block, found by walking
    the typed config, refuses both with the key, the value and the range its bounds declare."""
    floats = [
        (key, block, name, field)
        for key, block in _blocks(PofeConfig, "pofe")
        for name, field in block.model_fields.items()
        if _holds_floats(field.annotation)
    ]
    assert len(floats) >= 20 and ("pofe.online", OnlineConfig, "kl_coef") in [f[:3] for f in floats]
    for key, block, name, field in floats:
        sequence = any(
            typing.get_origin(a) in (list, tuple) for a in (field.annotation, *typing.get_args(field.annotation))
        )
        for bad in (math.inf, -math.inf, math.nan):
            value = (1.0, bad) if sequence else bad
            with pytest.raises(ValidationError) as refused:
                block.model_validate({name: value})
            said = {e["loc"]: e["msg"] for e in refused.value.errors()}
            signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
            bounds = " and ".join(
                f"{s} {getattr(m, n)}" for m in field.metadata for n, s in signs.items() if hasattr(m, n)
            )
            assert said.get((name,)) == (
                f"Value error, {name}: {value!r} is out of range; set {'each ' * sequence}a finite number"
                + f" {bounds}" * bool(bounds)
            ), f"{key}.{name}"


def test_a_number_out_of_range_is_named_with_its_value():
    """Bounds refused before too, but pydantic's message left the value out (`hide_input_in_errors`)."""
    with pytest.raises(
        ValidationError,
        match=r"online.kl_coef\n  Value error, kl_coef: -0.5 is out of range; set a "
        r"finite number >= 0.0 \[",
    ) as refused:
        PofeConfig(online={"kl_coef": -0.5})
    assert len(refused.value.errors()) == 1
    with pytest.raises(
        ValidationError, match=r"anchor_mix: 1.5 is out of range; set a finite number >= 0.0 and <= 1.0"
    ):
        PofeConfig(anchor_mix=1.5)
    # a wrong type is pydantic's own error, not a range
    with pytest.raises(ValidationError, match="fractional part"):
        PofeConfig(online={"refresh_every": 2.5})


@pytest.mark.e2e
def test_axolotl_train_refuses_an_infinite_kl_coef_before_loading_the_model(tmp_path, monkeypatch):
    """`kl_coef: .inf` in the shipped online Nash-MD recipe: `axolotl train` stops at the recipe, naming the
    key, the value and the range, where it used to train a step and blame eta and margin for a NaN loss."""
    text = (ROOT / "recipes" / "tiny-nash-md-online-cpu.yml").read_text()
    assert "    kl_coef: 0.05\n" in text
    (tmp_path / "recipe.yml").write_text(text.replace("    kl_coef: 0.05\n", "    kl_coef: .inf\n"))
    monkeypatch.chdir(tmp_path)  # the recipe's paths are relative
    prepare(yaml.safe_load(text), seed=0, prompts=20)  # its model and prompts
    proc = run_axolotl("train", "recipe.yml", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "online.kl_coef\n  Value error, kl_coef: inf is out of range; set a finite number >= 0.0" in proc.stderr
    assert "FloatingPointError" not in proc.stderr and not (tmp_path / "outputs/tiny-nash-md-online-cpu").exists()


def test_anchor_mix_rules():
    """anchor_mix is a weight in [0, 1], SPPO's only; pofe.pi_0 names the model it mixes toward
    and does nothing without it; saturation_band lies in (0, 1/2)."""
    assert PofeConfig(method="sppo", anchor_mix=0.2, pi_0="/m/sft").anchor_mix == 0.2
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="anchor_mix"):
            PofeConfig(method="sppo", anchor_mix=bad)
    with pytest.raises(ValidationError, match="pofe.anchor_mix: 0.2 applies to `rl: sppo` only"):
        PofeConfig(method="rrhf", anchor_mix=0.2)
    with pytest.raises(
        ValidationError,
        match=r"pofe.pi_0 \(/m/sft\) is the model pofe.anchor_mix mixes the anchor toward, and anchor_mix is 0",
    ):
        PofeConfig(method="sppo", pi_0="/m/sft")
    with pytest.raises(ValidationError, match="pofe.saturation_band: 0.1 applies to `rl: sppo` only"):
        PofeConfig(method="rrhf", saturation_band=0.1)
    for bad in (0.0, 0.5):
        with pytest.raises(ValidationError, match="saturation_band"):
            PofeConfig(method="sppo", saturation_band=bad)


@pytest.mark.parametrize(
    "block,message",
    [
        ({"rank_wieght": 2.0}, "unknown key 'rank_wieght' (did you mean 'rank_weight'?)"),
        ({"judge": {"type": "python", "fuction": "m:f"}}, "unknown key 'fuction' (did you mean 'function'?)"),
        ({"generate": {"num_candiates": 4}}, "unknown key 'num_candiates' (did you mean 'num_candidates'?)"),
        ({"candidates": {"shardsize": 8}}, "unknown key 'shardsize' (did you mean 'shard_size'?)"),
        ({"eval": {"heldout": 4}}, "unknown key 'heldout' (did you mean 'held_out'?)"),
        ({"stop_when": {"held_out_reward_fall": True}}, "(did you mean 'held_out_reward_falls'?)"),
        ({"generate": {"serve": {"comand": "x {model} {port}"}}}, "unknown key 'comand' (did you mean 'command'?)"),
        ({"round_prompts": [{"pth": "a"}], "rounds": 1}, "unknown key 'pth' (did you mean 'path'?)"),
        ({"zzz": 1}, "unknown key 'zzz'; the keys here: anchor_mix, beta, candidates, dataset_fields,"),
        # pi_0's one name: the older key refused with it
        (
            {"anchor_base": "/m/sft", "anchor_mix": 0.1},
            "unknown key 'anchor_base' (renamed 'pi_0': rename the key, its value is read as before)",
        ),
    ],
)
def test_a_misspelt_key_is_named_with_the_nearest_one(block, message):
    """Every block of `pofe:` names a key it does not know with the nearest it does (difflib),
    where pydantic said only "Extra inputs are not permitted"; with no near key, the keys there
    are. The error's location names the block (pofe.judge, pofe.eval, ...)."""
    with pytest.raises(ValidationError) as e:
        PofeArgs.model_validate({"pofe": {"method": "rrhf", **block}})
    assert message in str(e.value)


def test_a_misspelt_field_key_on_a_dataset_entry_is_named():
    """axolotl's dataset schema drops keys it does not know: `field_promt` would vanish and the
    prompt column fall back to `prompt`."""
    raw = {"rl": "rrhf", "datasets": [{"path": "d.jsonl", "type": "pofe.pairs", "field_promt": "question"}]}
    with pytest.raises(
        ValueError, match=r"datasets\[0\] \(d.jsonl\): unknown key 'field_promt' \(did you mean 'field_prompt'\?\)"
    ):
        translate_raw_config(raw)


def test_beta_is_one_over_eta():
    """TRL's beta: beta 0.1 is eta 10; both set is refused; the validated block keeps eta alone,
    so it validates again to itself. Under RRHF, beta is refused as SPPO's."""
    c = PofeConfig(method="sppo", beta=0.1)
    assert c.eta == pytest.approx(10.0) and "beta" not in c.model_dump()
    assert PofeConfig.model_validate(c.model_dump()).model_dump() == c.model_dump()
    with pytest.raises(
        ValidationError, match=r"pofe.beta \(0.1\) and pofe.eta \(10.0\) are both set: beta is TRL's name"
    ):
        PofeConfig(method="sppo", beta=0.1, eta=10.0)
    with pytest.raises(ValidationError, match="pofe.beta: 0.1 applies to `rl: sppo` only"):
        PofeConfig(method="rrhf", beta=0.1)
    with pytest.raises(ValidationError, match="beta"):
        PofeConfig(method="sppo", beta=0.0)


@pytest.mark.parametrize("extra", [{"rl_beta": 0.1}, {"dpo_beta": 0.1}, {"trl": {"beta": 0.1}}])
def test_axolotls_beta_is_refused_with_the_key_that_means_it(extra):
    key = next(iter(extra)) if "trl" not in extra else "trl.beta"
    with pytest.raises(
        ValueError, match=rf"`{key}: 0.1` is axolotl's DPO beta.*`pofe.beta: 0.1` \(TRL's beta, 1 / pofe.eta: eta 10\)"
    ):
        translate_raw_config({"rl": "sppo", **extra})


def test_method_judge_and_keep_rules():
    """The rule pofe.methods.check_candidate_rules declares once, as the config sees it."""
    judge = {"type": "pairrm", "model": "llm-blender/PairRM"}
    with pytest.raises(ValidationError, match="judge.type: pairrm gives pairwise preferences; RRHF needs"):
        PofeConfig(method="rrhf", generate={}, judge=judge)
    with pytest.raises(ValidationError, match="candidates.keep: best_worst applies to method sppo only"):
        PofeConfig(method="rrhf", candidates={"keep": "best_worst"})
    PofeConfig(method="sppo", generate={}, judge=judge, candidates={"keep": "best_worst"})


def test_pofe_config_reads_every_form():
    """One accessor for a raw YAML dict (`rl:` counts, the dict is left alone), axolotl's
    validated DictDefault, and an object holding a PofeConfig."""
    from types import SimpleNamespace

    from axolotl.utils.dict import DictDefault

    expected = PofeConfig(method="sppo", eta=10.0)
    raw = {"rl": "sppo", "pofe": {"eta": 10.0}}
    assert pofe_config(raw) == expected
    assert raw == {"rl": "sppo", "pofe": {"eta": 10.0}}
    assert pofe_config(DictDefault({"pofe": expected.model_dump(exclude_none=True)})) == expected
    assert pofe_config(SimpleNamespace(pofe=expected)) is expected
    assert pofe_config({"base_model": "x"}) == PofeConfig()


def test_sample_packing_is_refused():
    with pytest.raises(ValidationError, match="set sample_packing: false"):
        PofeArgs.model_validate({"rl": "rrhf", "sample_packing": True, "datasets": []})


def test_every_pofe_key_is_in_the_reference_tables():
    """Each key of the pofe: block (nested blocks too) has a row in docs/yaml-reference.md."""

    reference = (ROOT / "docs" / "yaml-reference.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in reference.splitlines() if line.startswith("| `")}

    def keys(model, prefix):
        for name, field in model.model_fields.items():
            if f"{prefix}.{name}" in rows:
                yield f"{prefix}.{name}"  # a block documented by reference, e.g. eval.judge2
                continue
            sub = field.annotation
            blocks = [c for c in getattr(sub, "__args__", (sub,)) if hasattr(c, "model_fields")]
            if not blocks:
                yield f"{prefix}.{name}"  # a leaf; nested blocks are checked key by key
            for block in blocks:
                yield from keys(block, f"{prefix}.{name}")

    missing = [k for k in keys(PofeConfig, "pofe") if k not in rows]
    assert not missing, f"not in docs/yaml-reference.md: {missing}"


# ---- the trainers' arguments: the plugin's two TrainingArguments hooks --------------

TRAINER_BLOCK = {"method": "sppo", "eta": 7.0, "sppo_loss": "hard", "logit_chunk_size": 16, "prefix_layout": "cache"}
# RRHF's own keys, at their defaults under `rl: sppo` (another value there is refused)
RRHF_DEFAULTS = {"pofe_rank_weight": 1.0, "pofe_margin": 0.0, "pofe_length_penalty": 1.0}


@pytest.fixture
def plugin_registered(monkeypatch):
    """The plugin manager holding only PofePlugin, and axolotl's TrainingArguments class as
    `axolotl.core.training_args` builds it when the plugin registered before that import:
    `merge_training_args` mixes in what `get_training_args_mixin` names."""
    from collections import OrderedDict
    from dataclasses import dataclass

    import axolotl.core.training_args as axolotl_args
    from axolotl.integrations.base import PluginManager
    from axolotl.integrations.config import merge_training_args
    from transformers import TrainingArguments

    from pofe import PofePlugin

    manager = PluginManager.get_instance()
    monkeypatch.setattr(manager, "plugins", OrderedDict({"pofe.PofePlugin": PofePlugin()}))
    merged = dataclass(type("AxolotlTrainingArguments", (merge_training_args(), TrainingArguments), {}))
    monkeypatch.setattr(axolotl_args, "AxolotlTrainingArguments", merged)
    return manager, merged


def test_trainer_args_come_from_the_plugin_hooks(plugin_registered, tmp_path):
    """The builder's route: `get_training_args(cfg)` fills the merged fields from the block;
    the arguments still serialise for trackers (`to_dict`, `to_json_string`)."""
    import json

    from axolotl.utils.dict import DictDefault

    manager, merged = plugin_registered
    kwargs = manager.get_training_args(DictDefault(pofe=TRAINER_BLOCK))
    args = merged(output_dir=str(tmp_path), report_to=[], use_cpu=True, **kwargs)
    expected = {f"pofe_{key}": value for key, value in TRAINER_BLOCK.items()} | RRHF_DEFAULTS
    assert {key: getattr(args, key) for key in expected} == expected
    assert {key: args.to_dict()[key] for key in expected} == expected
    assert {key: json.loads(args.to_json_string())[key] for key in expected} == expected
    # without a POFE method the plugin adds nothing
    assert manager.get_training_args(DictDefault(base_model="x")) == {}


def test_trainer_arg_names_clash_with_nothing():
    from dataclasses import fields

    from axolotl.core.training_args_base import AxolotlTrainingMixins
    from transformers import TrainingArguments

    from pofe.training_args import PofeTrainingArgsMixin

    ours = {f.name for f in fields(PofeTrainingArgsMixin)}
    assert ours.isdisjoint(f.name for f in fields(TrainingArguments))
    assert ours.isdisjoint(f.name for f in fields(AxolotlTrainingMixins))


def test_unmerged_trainer_args_are_named(monkeypatch):
    """axolotl merges the mixin only when the plugin registered before it first imported
    `axolotl.core.training_args`: the hook says so instead of the builder's TypeError."""
    from dataclasses import dataclass

    import axolotl.core.training_args as axolotl_args
    from axolotl.utils.dict import DictDefault
    from transformers import TrainingArguments

    from pofe import PofePlugin

    monkeypatch.setattr(axolotl_args, "AxolotlTrainingArguments", dataclass(type("Plain", (TrainingArguments,), {})))
    with pytest.raises(RuntimeError, match="imported before PofePlugin registered"):
        PofePlugin().get_training_args(DictDefault(pofe=TRAINER_BLOCK))


def test_model_load_is_seeded_by_the_recipe():
    """LoRA's A matrices are drawn while the model loads, before the Trainer seeds: the hook
    seeds first, so two loads with one seed draw the same numbers (and another seed others)."""
    import torch
    from axolotl.utils.dict import DictDefault

    from pofe import PofePlugin

    def draw(seed):
        PofePlugin().pre_model_load(DictDefault(pofe={"method": "rrhf"}, seed=seed))
        return torch.rand(4)

    torch.manual_seed(123)
    first = draw(7)
    torch.manual_seed(456)
    assert torch.equal(draw(7), first)
    assert not torch.equal(draw(8), first)
