"""Iterated runs without training: prompt splits, derived recipes, the state file, config."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pofe.args import PofeConfig
from pofe.args.rounds import EvalConfig
from pofe.run.folder import RunFolder, RunState, RunStateMismatch
from pofe.run.prompts import resolve_round_prompts, split_prompts
from pofe.run.recipe import recipe_fingerprint
from pofe.run.rounds.round_recipe import round_recipe


def test_split_prompts_disjoint_and_covering():
    """10 prompts over 3 rounds: sizes 4, 3, 3; disjoint; together every prompt once."""
    parts = split_prompts(10, 3, "split")
    assert [list(p) for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [list(p) for p in split_prompts(5, 2, "all")] == [list(range(5))] * 2
    with pytest.raises(ValueError, match="cannot be split"):
        split_prompts(2, 3, "split")


def test_auto_round_prompts():
    assert resolve_round_prompts("sppo", "auto") == "split"
    assert resolve_round_prompts("rrhf", "auto") == "all"
    assert resolve_round_prompts("rrhf", "split") == "split"


RAW = {
    "base_model": "/m/base",
    "lora_model_dir": "/m/adapter",
    "rl": "sppo",
    "datasets": [{"path": "data/p.jsonl", "type": "pofe.prompts", "field_prompt": "q", "split": "train"}],
    "output_dir": "/runs/x",
    "dataset_prepared_path": "/prep",
    "save_strategy": "no",
    "pofe": {
        "rounds": 3,
        "eval": {"held_out": 4},
        "generate": {"backend": "transformers", "seed": 7},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    },
}


def test_round_recipe_points_everything_at_the_round():
    folder = RunFolder(__import__("pathlib").Path("/runs/x"))
    r1, _ = round_recipe(RAW, folder, 1, "/m/base", seed=7)
    r2, forced_save = round_recipe(RAW, folder, 2, "/runs/x/round-1/merged", seed=8)
    assert r1["lora_model_dir"] == "/m/adapter" and "lora_model_dir" not in r2  # merged already
    assert r2["base_model"] == "/runs/x/round-1/merged"
    assert r2["output_dir"] == "/runs/x/round-2/train"
    assert r2["dataset_prepared_path"] == "/runs/x/round-2/prepared"
    assert r2["datasets"] == [
        {"path": "/runs/x/prompts/round-2.jsonl", "ds_type": "json", "type": "pofe.prompts", "field_prompt": "q"}
    ]
    assert r2["pofe"]["generate"] == {"backend": "transformers", "seed": 8, "model": "/runs/x/round-1/merged"}
    assert r2["pofe"]["candidates"] == {"out_dir": "/runs/x/round-2/candidates"}
    assert "rounds" not in r2["pofe"] and "eval" not in r2["pofe"]
    # save_strategy: no -> one save at the end, so trainer_state.json (the loss curve) exists
    assert r2["save_strategy"] == "steps" and r2["save_only_model"] and forced_save
    assert RAW["base_model"] == "/m/base" and RAW["save_strategy"] == "no"  # the input is untouched


def test_fingerprint_ignores_rounds_and_eval_only():
    other = json.loads(json.dumps(RAW))
    other["pofe"]["rounds"] = 5
    other["pofe"]["eval"] = {"held_out": 9}
    assert recipe_fingerprint(other) == recipe_fingerprint(RAW)
    other["learning_rate"] = 1.0
    assert recipe_fingerprint(other) != recipe_fingerprint(RAW)


def test_state_file_records_stages_and_refuses_another_recipe(tmp_path):
    path = tmp_path / "pofe-run.json"
    st = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    st.start("round-1/train")
    # killed here: a restart sees the stage as unfinished
    st = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    assert not st.done("round-1/train")
    st.start("round-1/train")
    st.finish("round-1/train", output_dir="o")
    again = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    assert again.done("round-1/train") and again.stages["round-1/train"]["output_dir"] == "o"
    assert len(again.starts) == 3
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temporary files
    with pytest.raises(RunStateMismatch, match="different recipe"):
        RunState.open(path, fingerprint="b", recipe="r.yml", method="rrhf")


def test_config_keys():
    cfg = PofeConfig(method="sppo", rounds=3, eval={"held_out": 5})
    assert cfg.round_prompts == "auto" and cfg.eval.num_samples == 4 and cfg.eval.temperature == 1.0
    assert PofeConfig().rounds == 1 and PofeConfig().eval == EvalConfig()  # on, with the default slice
    assert EvalConfig().held_out is None and EvalConfig().has_held_out and EvalConfig(num_samples=2).num_samples == 2
    with pytest.raises(ValueError, match="held-out prompts"):
        EvalConfig(held_out=0, num_samples=2)
    with pytest.raises(ValueError, match="not both"):
        EvalConfig(prompts="p.jsonl", held_out=3)
    with pytest.raises(ValueError, match="greedy"):
        EvalConfig(held_out=3, temperature=0.0, num_samples=2)
    with pytest.raises(ValueError, match="OpenAI-compatible server"):
        PofeConfig(
            method="rrhf",
            rounds=2,
            generate={"backend": "openai", "base_url": "http://x/v1"},
            judge={"type": "python", "function": "m:f"},
        )


def test_held_out_answers_get_the_candidates_token_budget():
    """Unset, the held-out cap is the candidates' (a 64-token cap under 2048-token candidates, as
    the SPPO recipes had, cut every model's answers at one length); a set cap wins; no generate
    block: 64."""
    from pofe.run.evaluation.answers import held_out_sampling

    blocks = {
        "generate": {"backend": "transformers", "max_new_tokens": 2048},
        "judge": {"type": "python", "function": "m:f"},
    }
    cfg = PofeConfig(method="sppo", rounds=2, **blocks)
    assert held_out_sampling(cfg.eval, cfg.generate).max_new_tokens == 2048
    cfg = PofeConfig(method="sppo", rounds=2, eval={"max_new_tokens": 32}, **blocks)
    assert held_out_sampling(cfg.eval, cfg.generate).max_new_tokens == 32
    assert held_out_sampling(EvalConfig(), None).max_new_tokens == 64


def test_default_held_out_size_by_hand():
    """5 % of the pool, at least 16, at most 256, never more than a fifth of the pool."""
    from pofe.run.prompts import default_held_out, held_out_count

    by_hand = {0: 0, 4: 0, 5: 1, 14: 2, 40: 8, 80: 16, 100: 16, 320: 16, 339: 17, 1000: 50, 5120: 256, 100000: 256}
    assert {n: default_held_out(n) for n in by_hand} == by_hand
    assert held_out_count(100, None, has_own_prompts=False) == 16
    assert held_out_count(100, 0, has_own_prompts=False) == 0  # `held_out: 0`: off
    assert held_out_count(100, 30, has_own_prompts=False) == 30
    assert held_out_count(100, None, has_own_prompts=True) == 0  # the recipe's own held-out file
    with pytest.raises(ValueError, match="held_out=14 leaves none of the 14 prompts"):
        held_out_count(14, 14, has_own_prompts=False)


@pytest.mark.parametrize(
    ("pool", "eval_keys", "held"),
    [(100, None, 16), (14, None, 2), (4, None, 0), (100, {"held_out": 0}, 0), (100, {"held_out": 7}, 7)],
)
def test_held_out_rows_never_reach_a_round(tmp_path, pool, eval_keys, held):
    """The prompts stage holds out the pool's last rows (the default slice with no eval keys):
    no round's prompt file holds any of them; `held_out: 0` writes no held-out file."""
    from tests.helpers import prompts_in, prompts_stage

    base = tmp_path / "pool.jsonl"
    base.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(pool)))
    pofe = {
        "rounds": 2,
        "generate": {"backend": "transformers"},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
        **({"eval": eval_keys} if eval_keys else {}),
    }
    folder, _, _ = prompts_stage(tmp_path, "sppo", base, pofe)
    trained = prompts_in(folder.round_prompts(1)) + prompts_in(folder.round_prompts(2))
    assert trained == [f"p{i}" for i in range(pool - held)]  # SPPO's split: every other row once
    if held:
        assert prompts_in(folder.held_out_prompts) == [f"p{i}" for i in range(pool - held, pool)]
    else:
        assert not folder.held_out_prompts.exists()


def test_axolotl_merge_lora_equals_peft_merge(tiny_model, tmp_path):
    """The runner's merge stage (axolotl's memory-efficient `merge-lora`, shard by shard) gives
    the weights of peft's `merge_and_unload` on the whole model (the merge POFE ran before);
    the merged model's logits are the base's with the adapter applied."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pofe.run.rounds.loop import merge_command
    from tests.helpers import AXOLOTL_ENV, assert_float_close, recipe

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # a fresh adapter is a no-op; make it matter
    peft.save_pretrained(tmp_path / "adapter")
    cfg = recipe(
        tmp_path,
        tiny_model,
        "rrhf",
        tmp_path / "unused.jsonl",
        "pofe.rrhf",
        adapter="lora",
        lora_r=4,
        lora_alpha=8,
        lora_target_modules=["q_proj", "v_proj", "down_proj"],
    )
    env = {**os.environ, **AXOLOTL_ENV}
    subprocess.run(
        merge_command(cfg, tmp_path / "adapter", tmp_path / "round"),
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )

    merged_dir = tmp_path / "round" / "merged"
    merged = load_file(merged_dir / "model.safetensors")
    reference = (
        PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), tmp_path / "adapter"
        )
        .merge_and_unload()
        .state_dict()
    )
    plain = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    assert set(merged) <= set(reference) and {k for k in reference if "proj" in k} <= set(merged)
    diff = max((merged[k] - reference[k]).abs().max().item() for k in merged)
    changed = [k for k in merged if not torch.equal(merged[k], plain[k])]
    print(f"axolotl merge-lora vs peft merge_and_unload: max abs weight diff {diff:.3g}")
    for k in merged:  # W + s B A: a float32 sum over the rank (4) and the base weight, in some order
        assert_float_close(merged[k], reference[k], n_terms=4 + 1, msg=lambda m, k=k: f"{k}: {m}")
    assert sorted(changed) == sorted(k for k in merged if any(m in k for m in ("q_proj", "v_proj", "down_proj")))

    model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 10, 20, 30, 40, 50]])
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), tmp_path / "adapter"
    ).eval()
    with torch.no_grad():  # float32 sums over the MLP's width (128), the widest reduction
        assert_float_close(model(ids).logits, adapted(ids).logits, n_terms=model.config.intermediate_size)
    assert (merged_dir / "tokenizer_config.json").exists()


def test_killed_training_resumes_from_its_last_complete_checkpoint(tmp_path, monkeypatch):
    """Round 1's train stage was killed after saving checkpoints 2, 9 and 10 and while
    saving 12 (no trainer_state.json yet). The restart's recipe resumes from 10: the
    highest complete step (by number: "checkpoint-9" sorts after "checkpoint-10" as text)."""
    import yaml

    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner

    folder = RunFolder(tmp_path / "run")
    train = folder.train(1)
    # the killed start recorded what it trained with (its recipe had no resume_from_checkpoint)
    rounds.claim_training(folder, 1, round_recipe(RAW, folder, 1, "/m/base", seed=7).recipe, None)
    for step in (2, 9, 10, 12):
        (train / f"checkpoint-{step}").mkdir(parents=True)
        if step != 12:
            (train / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="sppo")
    state.start("round-1/preprocess")
    state.finish("round-1/preprocess")
    state.start("round-1/train")  # killed here

    ran = []

    def fake_stage(cmd, log, echo, stream, keep_fds=(), env=None):
        recipe = yaml.safe_load(Path(cmd[2]).read_text())
        ran.append((cmd[1], recipe.get("resume_from_checkpoint"), keep_fds))
        final = train / "checkpoint-20"  # the forced save at the end (save_strategy: no)
        final.mkdir()
        (final / "trainer_state.json").write_text(json.dumps({"global_step": 20}))

    monkeypatch.setattr(runner, "run_logged", fake_stage)
    said = []
    plan = rounds.RoundPlan(t=1, rounds=1, policy="/m/base", adapter=False, seed=7)
    stages = runner.StageRunner(state, echo=said.append, stream=False, keep_fds=(5,))
    rounds.run_round(RAW, folder, plan, stages)
    resumed = str(train / "checkpoint-10")
    assert ran == [("train", resumed, (5,))]
    assert said == [f"round 1/1: train, resuming from {resumed}"]
    record = state.stages["round-1/train"]
    assert record["status"] == "done" and record["resumed_from"] == resumed
    assert json.loads(folder.trainer_state(1).read_text()) == {"global_step": 20}
    assert not list(train.glob("checkpoint-*"))  # the forced save's cleanup, after the stage

    # started again: nothing runs, and round-1/recipe.yml still says what ran
    rounds.run_round(RAW, folder, plan, stages)
    assert len(ran) == 1
    assert yaml.safe_load(folder.recipe(1).read_text())["resume_from_checkpoint"] == resumed


def test_training_without_checkpoints_starts_over(tmp_path):
    from pofe.run.rounds.loop import resume_point

    folder = RunFolder(tmp_path)
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="rrhf")
    state.start("round-1/train")
    (folder.train(1) / "checkpoint-3").mkdir(parents=True)  # cut short: no trainer_state.json
    assert resume_point(folder, state, 1) is None
    recipe, _ = round_recipe(RAW, folder, 1, "/m/base", seed=7, resume_from=None)
    assert "resume_from_checkpoint" not in recipe


def _killed_round_1(folder: RunFolder, raw: dict, steps=(6,)) -> RunState:
    """Round 1 trained from `raw` (recorded), saved checkpoint-<step> for each of `steps`, and was
    killed; its state file then went (`pofe-run.json` deleted): a new state, nothing done."""
    from pofe.run.rounds import loop as rounds

    rounds.claim_training(folder, 1, round_recipe(raw, folder, 1, "/m/base", seed=7).recipe, None)
    for step in steps:
        (folder.train(1) / f"checkpoint-{step}").mkdir(parents=True)
        (folder.train(1) / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    state = RunState.open(folder.state, fingerprint="b", recipe="r.yml", method="sppo")
    state.start("round-1/preprocess")
    state.finish("round-1/preprocess")
    return state


@pytest.mark.parametrize("change", ["learning_rate", "candidates", "no record"])
def test_another_recipes_checkpoint_is_not_resumed(tmp_path, monkeypatch, change):
    """Bad case 1 of issue 20: with pofe-run.json gone, a run with another learning rate (or
    other candidates, or checkpoints nobody recorded) resumed round 1 from the old run's
    checkpoint-6 and trained for 0 s. Now it stops before training, naming the checkpoint and
    what differs."""
    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner
    from pofe.run.rounds.checkpoints import RECORD_NAME

    folder = RunFolder(tmp_path / "run")
    (folder.candidates(1)).mkdir(parents=True)
    (folder.candidates(1) / "data.jsonl").write_text('{"prompt": "a"}\n')
    state = _killed_round_1(folder, RAW)
    raw = {**RAW, "learning_rate": 0.5} if change == "learning_rate" else RAW
    if change == "candidates":
        (folder.candidates(1) / "data.jsonl").write_text('{"prompt": "b"}\n')
    if change == "no record":
        (folder.train(1) / RECORD_NAME).unlink()
    ran = []
    monkeypatch.setattr(runner, "run_logged", lambda cmd, *a, **k: ran.append(cmd))
    plan = rounds.RoundPlan(t=1, rounds=1, policy="/m/base", adapter=False, seed=7)
    checkpoint = folder.train(1) / "checkpoint-6"
    says = {
        "learning_rate": r"differs in: learning_rate\)",
        "candidates": r"differs in: <candidates data.jsonl>\)",
        "no record": "is missing or unreadable",
    }[change]
    with pytest.raises(
        RunStateMismatch, match=rf"round 1 would resume from {re.escape(str(checkpoint))}.*{says}.*Delete "
    ):
        rounds.run_round(raw, folder, plan, runner.StageRunner(state, echo=lambda _: None, stream=False))
    assert ran == [] and not state.stages.get("round-1/train")


def test_the_same_recipe_resumes_past_a_damaged_checkpoint(tmp_path):
    """checkpoints 4 and 6 are complete by the trainer's mark (trainer_state.json), but 6's
    weights are cut short (its safetensors header promises more bytes than the file has):
    round 1 resumes from 4, saying which file of 6 is damaged. Then 6's optimizer.pt (a torch
    zip) is cut short instead: the same."""
    import torch
    from safetensors.torch import save_file

    from pofe.run.rounds.loop import resume_point

    folder = RunFolder(tmp_path / "run")
    state = _killed_round_1(folder, RAW, steps=(4, 6))
    damaged = folder.train(1) / "checkpoint-6"
    for checkpoint in ("checkpoint-4", "checkpoint-6"):
        save_file({"w": torch.ones(64)}, folder.train(1) / checkpoint / "model.safetensors")
        torch.save({"state": torch.ones(64)}, folder.train(1) / checkpoint / "optimizer.pt")
    said = []
    assert resume_point(folder, state, 1, said.append) == damaged  # whole: the newest
    weights = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(weights[:-10])
    assert resume_point(folder, state, 1, said.append) == folder.train(1) / "checkpoint-4"
    need = len(weights)
    assert said == [
        f"not resuming from {damaged}: {damaged / 'model.safetensors'} has {need - 10} bytes; its "
        f"header says {need}; trying the checkpoint before it"
    ]
    (damaged / "model.safetensors").write_bytes(weights)
    optimizer = (damaged / "optimizer.pt").read_bytes()
    (damaged / "optimizer.pt").write_bytes(optimizer[: len(optimizer) // 2])
    said.clear()
    assert resume_point(folder, state, 1, said.append) == folder.train(1) / "checkpoint-4"
    assert said[0].startswith(f"not resuming from {damaged}: {damaged / 'optimizer.pt'} is cut short or damaged")


def test_a_lost_merged_model_is_merged_again(tmp_path, monkeypatch):
    """Weak case of issue 20: round-1/merged deleted between starts while the state said
    merged failed every later start. Now the merge stage runs again (and only it)."""
    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner

    folder = RunFolder(tmp_path / "run")
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="sppo")
    for stage in ("round-1/preprocess", "round-1/train", "round-1/merge"):
        state.start(stage)
        state.finish(stage)
    ran = []
    monkeypatch.setattr(runner, "run_logged", lambda cmd, *a, **k: ran.append(cmd[1]))
    said = []
    plan = rounds.RoundPlan(t=1, rounds=2, policy="/m/base", adapter=True, seed=7)
    stages = runner.StageRunner(state, echo=said.append, stream=False)
    (folder.merged(1)).mkdir(parents=True)
    (folder.merged(1) / "config.json").write_text("{}")
    rounds.run_round(RAW, folder, plan, stages)
    assert ran == []  # there: nothing redone
    (folder.merged(1) / "config.json").unlink()
    rounds.run_round(RAW, folder, plan, stages)
    assert ran == ["merge-lora"] and state.done("round-1/merge")
    assert said[0] == (
        f"round 1: {folder.merged(1)} is missing (or has no config.json) though the state says merged: merging again"
    )


def test_a_replaced_prompt_file_is_named_at_the_next_start(tmp_path):
    """Weak case of issue 20: the prompts stage copies the prompt file once, so a file replaced
    between starts was silently ignored. Its sha256 is recorded at the first start."""
    from types import SimpleNamespace

    from pofe.run.guards import check_prompt_sources, prompt_sources

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"q": "a"}\n')
    cfg = SimpleNamespace(datasets=[SimpleNamespace(path=str(prompts))])
    pcfg = PofeConfig(method="rrhf")
    state = RunState.open(tmp_path / "pofe-run.json", fingerprint="a", recipe="r.yml", method="rrhf")
    check_prompt_sources(prompt_sources(cfg, pcfg), state)
    assert list(state.prompt_sources) == [str(prompts)]
    check_prompt_sources(prompt_sources(cfg, pcfg), RunState.read(state.path))  # unchanged: fine
    prompts.write_text('{"q": "b"}\n')
    with pytest.raises(RunStateMismatch, match=rf"the prompt file {re.escape(str(prompts))} changed since"):
        check_prompt_sources(prompt_sources(cfg, pcfg), RunState.read(state.path))
    # round_prompts as sets: a local file, and a dataset spec naming a local file
    second = tmp_path / "r2.jsonl"
    second.write_text('{"q": "c"}\n')
    sets = PofeConfig(method="rrhf", rounds=2, round_prompts=[str(prompts), {"path": str(second)}])
    assert list(prompt_sources(cfg, sets)) == [str(prompts), str(second)]
