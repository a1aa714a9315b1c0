"""The round loop (`pofe.run.rounds.loop`) without training: a killed round's stages, the LoRA
merge between rounds, a lost merged model merged again, damaged candidates rebuilt."""

from __future__ import annotations

import os
import re
import subprocess

from pofe.run.folder import RunFolder, RunState
from tests.helpers import ITERATED_RAW, whole_candidates


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
    whole_candidates(folder, 1)
    ran = []
    monkeypatch.setattr(runner, "run_logged", lambda cmd, *a, **k: ran.append(cmd[1]))
    said = []
    plan = rounds.RoundPlan(t=1, rounds=2, policy="/m/base", adapter=True, seed=7)
    stages = runner.StageRunner(state, echo=said.append, stream=False)
    (folder.merged(1)).mkdir(parents=True)
    (folder.merged(1) / "config.json").write_text("{}")
    rounds.run_round(ITERATED_RAW, folder, plan, stages)
    assert ran == []  # there: nothing redone
    (folder.merged(1) / "config.json").unlink()
    rounds.run_round(ITERATED_RAW, folder, plan, stages)
    assert ran == ["merge-lora"] and state.done("round-1/merge")
    assert said[0] == (
        f"round 1: {folder.merged(1)} is missing (or has no config.json) though the state says merged: merging again"
    )


class Numbered:
    """Candidates "<prompt> a<i>": distinct per prompt and sample, no model needed; the prompt's
    text without the chat template's role tokens, whose user header would begin a user turn of its
    own, cut away."""

    name = "numbered"

    def __init__(self):
        self.calls = 0

    def generate(self, prompts, n, sampling):
        self.calls += 1
        return [[f"{re.sub(r'<[|][a-z]+[|]>', '', p.text)} a{i}" for i in range(n)] for p in prompts]


def test_a_damaged_data_jsonl_is_rebuilt_before_it_is_used(tiny_model, tmp_path, monkeypatch):
    """Bad case 5 of issue 33: data.jsonl cut to 2 whole rows and a broken line after preprocess
    was trained from the cached rows, published and recorded as trained on. Now the next start
    finds its sha256 is not the one summary.json recorded, drops the round's tokenised rows and
    preprocesses again, whose pipeline rebuilds the file from its shards, byte for byte, without
    generating."""
    from pofe.run.rounds import loop as rounds
    from pofe.run.rounds import runner
    from pofe_candidates import CandidatesConfig, GenerateConfig, JudgeConfig, run_pipeline
    from pofe_candidates.build import data_problem

    folder = RunFolder(tmp_path / "run")
    out = folder.candidates(1)

    def preprocess(generator) -> bytes:
        run_pipeline(
            [{"prompt": f"{i}+{i}="} for i in range(5)],
            method="rrhf",
            policy_path=str(tiny_model),
            generate=GenerateConfig(num_candidates=2),
            judge=JudgeConfig(type="python", function="pofe.demo.task:reward"),
            candidates=CandidatesConfig(out_dir=str(out), progress=False),
            generator=generator,
        )
        return (out / "data.jsonl").read_bytes()

    written = preprocess(Numbered())
    assert data_problem(out) is None
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="rrhf")
    for stage in ("round-1/preprocess", "round-1/train"):
        state.start(stage)
        state.finish(stage)
    folder.prepared(1).mkdir(parents=True)
    ran, said = [], []
    monkeypatch.setattr(runner, "run_logged", lambda cmd, *a, **k: ran.append(cmd[1]))
    monkeypatch.setattr(rounds, "push_round", lambda *a: None)
    plan = rounds.RoundPlan(t=1, rounds=1, policy=str(tiny_model), adapter=False, seed=7)
    stages = runner.StageRunner(state, echo=said.append, stream=False)
    rounds.run_round(ITERATED_RAW, folder, plan, stages)
    assert (ran, said) == ([], [])  # whole: nothing redone

    lines = written.decode().splitlines(keepends=True)
    (out / "data.jsonl").write_text("".join(lines[:2]) + lines[2][:10])
    problem = data_problem(out)
    assert problem.startswith(f"{out / 'data.jsonl'} has sha256 ") and problem.endswith(
        "it was written with (cut short or edited)"
    )
    rounds.run_round(ITERATED_RAW, folder, plan, stages)
    assert ran == ["preprocess"] and not folder.prepared(1).exists()
    assert said[0] == f"round 1: {problem}: preprocessing again, which rebuilds it from its shards"
    again = Numbered()
    assert preprocess(again) == written and again.calls == 0  # what the preprocess stage's pipeline does
    assert data_problem(out) is None
    (out / "data.jsonl").unlink()
    assert data_problem(out) == f"{out / 'data.jsonl'} is missing"
