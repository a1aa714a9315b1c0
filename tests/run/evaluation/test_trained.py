"""`axolotl pofe eval` and `report` of one trained model (issue 34): a recipe trained by `axolotl
train` on rows of its own, never from `pofe.prompts`, evaluated against its base model on
held-out prompts, with the iterated run's evaluation and report. Before, `pofe eval` answered
"no run state ... run axolotl pofe run first" and `pofe run` refused such a recipe."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import yaml

from pofe.demo.task import make_rrhf_rows, write_jsonl
from pofe.demo.tiny import build_tiny_model
from pofe.run.folder import RunFolder
from tests.helpers import (
    checked_eval_samples,
    log_history,
    pofe_block,
    prompts_file,
    recipe,
    run_axolotl,
    validated_recipe,
    writes_a_user_turn,
)

JUDGE = {"type": "python", "function": "pofe.demo.task:reward"}


@pytest.mark.e2e
def test_a_model_trained_on_its_own_rows_is_evaluated_against_its_base_and_reported(tmp_path, tiny_model):
    """16 k-response rows; `pofe.eval.held_out: 4` keeps the last 4 from training (12 rows, 3
    steps an epoch at micro-batch 4); `pofe eval` has the base (pi_0) and the trained model
    (pi_1) answer those 4 prompts twice each, judged by `pofe.eval.judge`. Every recorded reward
    is the demo reward of its answer recomputed here, each model's mean reward their mean, and
    the command line's `--seed 0` is recorded with the evaluation."""
    rows = make_rrhf_rows(16, k=4, seed=3)
    data = write_jsonl(rows, tmp_path / "rows.jsonl")
    block = {"eval": {"held_out": 4, "judge": JUDGE, "num_samples": 2, "max_new_tokens": 4}}
    cfg = recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf", pofe=block, learning_rate=1e-3)
    train = run_axolotl("train", str(cfg))
    assert f"the last 4 rows of {data} are held out for `axolotl pofe eval`" in train.stdout + train.stderr
    assert not list((tmp_path / "out").glob("*pofe-train.lock"))  # issue 50: no lock file left in the model
    proc = run_axolotl("pofe", "eval", str(cfg), "--seed", "0")

    folder = RunFolder(tmp_path / "out" / "pofe-eval")
    state = json.loads(folder.state.read_text())
    assert (state["kind"], state["pi_0"], state["overrides"]) == ("trained", str(tiny_model), {"seed": "0"})
    assert state["rounds"]["1"]["policy_out"] == str(tmp_path / "out")
    held = [json.loads(line)["prompt"] for line in folder.held_out_prompts.read_text().splitlines()]
    assert held == [r["prompt"] for r in rows[-4:]]
    ev, samples = checked_eval_samples(folder, held)
    assert [m["name"] for m in ev["models"]] == ["pi_0", "pi_1"]
    assert len(samples) == 2 * 4 * 2  # models x prompts x samples
    vs = ev["vs_pi_0"][1]
    assert 0.0 <= vs["raw"] <= 1.0 and not math.isnan(vs["lc"])
    assert len(ev["kl_to_pi_0"]) == 2
    report = (folder.root / "report.md").read_text()
    assert report.startswith("# POFE report: RRHF, a trained model against its base")
    assert "Command-line overrides: `seed: 0`." in report
    assert (folder.root / "report-loss.png").is_file()  # the training's loss curve, from its checkpoint
    assert f"POFE RRHF: {tmp_path / 'out'} (pi_1) against its base (pi_0)" in proc.stdout
    # `pofe report` finds the evaluation as `pofe eval` chose it
    again = run_axolotl("pofe", "report", str(cfg))
    assert f"report: {folder.root / 'report.md'}" in again.stdout


@pytest.mark.e2e
def test_a_model_trained_from_prompts_is_reported_with_its_candidates(tmp_path, tiny_model):
    """Issue 49: a recipe trained from prompts (`pofe.prompts`) has candidates of its own, which
    `axolotl train` sampled and judged into its candidates folder; `pofe eval`'s console showed
    the training's loss alone. 12 prompts, the last 4 held out: the training line now has the
    candidates' mean and best-of-k reward, recomputed here from the rows they were judged into
    (data.jsonl: every candidate kept), and the loss of the checkpoint's first and last step. The
    held-out line says its rewards are of sampled answers, not the demo's greedy ones."""
    data, _ = prompts_file(tmp_path)
    block = {**pofe_block("rrhf"), "eval": {"held_out": 4, "num_samples": 1, "max_new_tokens": 4}}
    cfg = recipe(tmp_path, tiny_model, "rrhf", data, "pofe.prompts", pofe=block, learning_rate=1e-3)
    run_axolotl("train", str(cfg))
    proc = run_axolotl("pofe", "eval", str(cfg))

    (cands,) = (tmp_path / "prepared").glob("pofe-candidates-*")
    rewards = [json.loads(line)["rewards"] for line in (cands / "data.jsonl").read_text().splitlines()]
    assert len(rewards) == 8
    flat = [x for r in rewards for x in r]

    # the policy's own samples (the generate shards' sources), by their judged rewards
    def shards(stage):
        return [json.loads(line) for p in sorted((cands / stage).glob("shard-*.jsonl")) for line in p.open()]

    sources = {g["index"]: dict(zip(g["candidates"], g["sources"])) for g in shards("generate")}
    policy = [
        x
        for j in shards("judge")
        for response, x in zip(j["responses"], j["rewards"] or [])
        if sources[j["index"]][response] == "policy"
    ]
    losses = [h["loss"] for h in log_history(tmp_path / "out") if "loss" in h]
    lines = proc.stdout.splitlines()
    assert (
        f"  training: candidates mean {sum(flat) / len(flat):.3f}, best-of-k "
        f"{sum(max(r) for r in rewards) / len(rewards):.3f}, policy samples {sum(policy) / len(policy):.3f}; "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    ) in lines
    # the held-out rewards are said to be of sampled answers (pofe.eval's default temperature 1),
    # apart from the demo's greedy ones
    pi_0 = json.loads((tmp_path / "out" / "pofe-eval" / "eval" / "eval.json").read_text())["mean_reward"][0]
    said = f"  held-out prompts, sampled answers (1 a prompt at temperature 1): pi_0 reward {pi_0:.3f}"
    assert any(line.startswith(said) for line in lines), lines


@pytest.mark.e2e
def test_held_out_answers_that_write_a_user_turn_are_cut_and_counted(tmp_path):
    """A base model that answers every prompt "42", then writes a user turn of its own
    ("<|user|>?") before its end of turn (`writes_a_user_turn`), trained one epoch (3 steps) at a
    learning rate too small to change its answers, and evaluated on 4 held-out prompts x 2 samples: each model's 8 answers are cut before "<|user|>"
    to "42" (the ids of "4" and "2"), counted in eval.json and on pofe eval's held-out line. Before,
    they were judged and scored as "42?" with the user turn's ids, and nothing said so."""
    model = build_tiny_model(tmp_path / "model")
    writes_a_user_turn(model)
    data = write_jsonl(make_rrhf_rows(16, k=4, seed=3), tmp_path / "rows.jsonl")
    block = {"eval": {"held_out": 4, "judge": JUDGE, "num_samples": 2, "max_new_tokens": 8}}
    cfg = recipe(tmp_path, model, "rrhf", data, "pofe.rrhf", pofe=block, learning_rate=1e-8)
    run_axolotl("train", str(cfg))
    proc = run_axolotl("pofe", "eval", str(cfg))

    folder = RunFolder(tmp_path / "out" / "pofe-eval")
    ev = json.loads((folder.eval_dir / "eval.json").read_text())
    assert ev["samples_cut_at_user_turn"] == [8, 8]
    samples = [json.loads(line) for line in (folder.eval_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16
    assert all((s["response"], s["tokens"], s["cut_at_user_turn"]) == ("42", 2, True) for s in samples)
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("  held-out prompts")]
    assert line.count("(8 of 8 answers cut where they began a user turn)") == 2, line


def test_held_out_rows_and_every_row_sharing_their_prompts_are_kept_from_training(tmp_path, tiny_model, caplog):
    """Pairs: rows 0-5, prompts p0 .. p5, with row 1 repeating p5. `held_out: 1` keeps row 5
    (p5) and row 1 (its prompt) from training: 4 rows left, counted in the log."""
    from transformers import AutoTokenizer

    from pofe.args import pofe_config
    from pofe.data.loader import LOG, _prepare

    prompts = [f"{i}+1=" for i in range(6)]
    prompts[1] = prompts[5]
    rows = [{"prompt": p, "chosen": "1", "rejected": "22"} for p in prompts]
    data = write_jsonl(rows, tmp_path / "pairs.jsonl")
    raw = yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.pairs").read_text())
    raw["pofe"] = {"eval": {"held_out": 1, "judge": JUDGE}}
    cfg = validated_recipe(
        raw, caps={"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}
    )
    LOG.logger.addHandler(caplog.handler)
    try:
        dataset = _prepare(cfg, pofe_config(cfg), AutoTokenizer.from_pretrained(tiny_model))
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert sorted(json.loads(p) for p in dataset["source_prompt"]) == sorted(prompts[i] for i in (0, 2, 3, 4))
    assert f"the last 1 rows of {data} are held out" in caplog.text
    assert "and 1 other rows with their prompts; training on 4 rows" in caplog.text


def test_the_validation_split_gives_the_held_out_prompts(tmp_path, tiny_model):
    """TRL's implicit-prompt pairs, 8 distinct prompts, val_set_size 0.25: the prompts are those
    of the 2 rows axolotl's split keeps from training, read back from the prepared rows; checked
    against those rows' own prompt tokens, rendered here from the prompts returned."""
    from transformers import AutoTokenizer

    from pofe.args import pofe_config
    from pofe.data.held_out import validation_prompts
    from pofe.data.loader import load_pofe_datasets
    from pofe.run.recipe import load_recipe

    def conv(q, a):
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]

    rows = [{"chosen": conv(f"{i}+2=", str(i + 2)), "rejected": conv(f"{i}+2=", "0")} for i in range(1, 9)]
    data = write_jsonl(rows, tmp_path / "ufb.jsonl")
    _, cfg = load_recipe(recipe(tmp_path, tiny_model, "sppo", data, "pofe.pairs", val_set_size=0.25))
    split = load_pofe_datasets(cfg, pofe_config(cfg))
    prompts, seen = validation_prompts(split.train_dataset, split.eval_dataset)
    assert len(prompts) == 2 and seen == 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rendered = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rendered]
    assert ids == split.eval_dataset["prompt_ids"]


def _loaded(tmp_path, tiny_model, **pofe):
    from pofe.run.recipe import load_recipe

    rows = make_rrhf_rows(6, k=2, seed=0)
    data = write_jsonl(rows, tmp_path / "rows.jsonl")
    path = recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf", pofe=pofe)
    return path, *load_recipe(path)


def test_what_a_trained_model_evaluation_needs_is_named(tmp_path, tiny_model):
    from pofe.run.evaluation.trained import open_trained

    def opened(model=None, **pofe):
        path, raw, cfg = _loaded(tmp_path, tiny_model, **pofe)
        return open_trained(path, raw, cfg, model, None, None, print)

    with pytest.raises(ValueError, match="names no judge to score the answers: set pofe.eval.judge"):
        opened(str(tiny_model))
    with pytest.raises(ValueError, match="no held-out prompts to evaluate on: name a file with pofe.eval.prompts"):
        opened(str(tiny_model), eval={"judge": JUDGE})
    # output_dir holds files (axolotl's load_cfg writes its debug.log there) but no model yet
    (tmp_path / "out").mkdir(exist_ok=True)
    with pytest.raises(ValueError, match=r"no trained model in .*out \(no config.json or adapter_config.json\)"):
        opened(eval={"judge": JUDGE, "held_out": 2})
    with pytest.raises(ValueError, match=r"no trained model at .*absent: no such folder \(.* holds: out\)"):
        opened(str(tmp_path / "absent"), eval={"judge": JUDGE, "held_out": 2})


def _whole_checkpoint(model, folder, step, of):
    """A checkpoint of `folder` holding `model`'s weights whole, at `step` of `of`."""
    checkpoint = folder / f"checkpoint-{step}"
    shutil.copytree(model, checkpoint)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": of}))
    return checkpoint


def test_a_model_that_is_not_whole_is_named_before_anything_is_written(tmp_path, tiny_model, monkeypatch):
    """`pofe eval --model M` of a model whose weights are cut short (a full disk, a partial copy),
    whose index names a shard that is missing, that is still training, or that is no folder at all
    (a typo): each refused naming the file, and the newest whole checkpoint to evaluate instead,
    before any evaluation state is written (it wrote pofe-eval/pofe-run.json, then failed with a
    safetensors traceback naming no file; a typo was told to give --output)."""
    from transformers import AutoModelForCausalLM

    from pofe.locks import TRAIN_LOCK, FolderLock
    from pofe.run.evaluation.evaluate import evaluate_run

    path, _, _ = _loaded(tmp_path, tiny_model, eval={"judge": JUDGE, "held_out": 2})

    def refused(model) -> str:
        with pytest.raises(ValueError) as error:
            evaluate_run(path, model=str(model))
        assert not list(tmp_path.rglob("pofe-eval"))  # nothing written: no state a report would read
        return str(error.value)

    cut = tmp_path / "m" / "cut"
    shutil.copytree(tiny_model, cut)
    weights = cut / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    assert refused(cut) == (
        f"{weights} has {size // 2} bytes; its header says {size}: it cannot be evaluated. It holds no whole "
        f"checkpoint. Train it again (`axolotl train {path}`)."
    )
    checkpoint = _whole_checkpoint(tiny_model, cut, 2, 4)
    assert refused(cut).endswith(
        f"Its newest whole checkpoint is {checkpoint} (step 2 of 4). Either evaluate it with --model {checkpoint}, "
        f"or finish the training first: set resume_from_checkpoint: {checkpoint} in {path} and run `axolotl train "
        f"{path}` again."
    )

    sharded = tmp_path / "m" / "sharded"
    AutoModelForCausalLM.from_pretrained(tiny_model).save_pretrained(sharded, max_shard_size="1MB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) == 2
    shards[1].unlink()
    assert refused(sharded).startswith(f"{sharded} lacks {shards[1].name}, named in its model.safetensors.index.json")

    training = tmp_path / "m" / "training"
    shutil.copytree(tiny_model, training)
    with FolderLock.acquire(training / TRAIN_LOCK, print, "axolotl train", RuntimeError):
        said = refused(training)
    assert said.startswith(f"{training} is still being trained (`axolotl train`, PID {os.getpid()} on host ")
    assert said.endswith(
        "it cannot be evaluated. Wait for the training to finish: it has written no whole checkpoint yet."
    )

    config = tmp_path / "m" / "config-cut"
    shutil.copytree(tiny_model, config)
    (config / "config.json").write_text((config / "config.json").read_text()[:30])
    assert refused(config).startswith(f"{config / 'config.json'} is not valid JSON (")

    monkeypatch.chdir(tmp_path)
    assert refused("m/typo") == (
        f"no trained model at {tmp_path / 'm' / 'typo'}: no such folder (m holds: config-cut, cut, sharded, "
        "training). Run "
        f"`axolotl train {path}` first, or give --model the folder of a trained model"
    )


def test_a_report_needs_a_finished_evaluation_of_a_model_still_whole(tmp_path, tiny_model):
    """`pofe report` of a trained model's evaluation: none there (an evaluation that stopped writes
    no state) is named with the command that makes one; an evaluation whose pi_1 has since been cut
    (or retrained and killed) is refused naming the file, not reported as that model."""
    from pofe.run.evaluation.trained import check_reportable
    from pofe.run.folder import RoundRecord, RunState

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    folder = RunFolder(model / "pofe-eval")
    with pytest.raises(ValueError, match=rf"^no evaluation in {folder.root}: `axolotl pofe eval r.yml` \(with"):
        check_reportable(folder, "r.yml")
    rounds = {"1": RoundRecord(policy_in=str(tiny_model), policy_out=str(model))}
    folder.root.mkdir()
    RunState(folder.state, "r.yml", "f", "rrhf", rounds=rounds, final_policy=str(model), kind="trained").save()
    check_reportable(folder, "r.yml")
    (model / "model.safetensors").unlink()
    with pytest.raises(
        ValueError, match=rf"^pi_1 is not whole now: {model} holds no weights .* this training did not"
    ):
        check_reportable(folder, "r.yml")


def test_an_evaluation_judge_beside_the_recipes_judge_is_refused():
    from pofe.args import PofeConfig

    with pytest.raises(ValueError, match="this recipe's pofe.judge judges its evaluation too"):
        PofeConfig(method="rrhf", generate={}, judge=JUDGE, eval={"judge": JUDGE})
    with pytest.raises(ValueError, match="pofe.eval.judge shapes the held-out evaluation"):
        PofeConfig(method="rrhf", eval={"judge": JUDGE, "held_out": 0})


def test_the_report_command_finds_a_run_or_an_evaluation(tmp_path):
    from pofe.run.evaluation.trained import report_folder

    recipe_path = tmp_path / "r.yml"
    recipe_path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out")}))
    assert report_folder(str(recipe_path), None, None, None).root == tmp_path / "out" / "pofe-eval"
    assert report_folder(str(recipe_path), None, None, str(tmp_path / "o2")).root == tmp_path / "o2" / "pofe-eval"
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "pofe-run.json").write_text("{}")  # an iterated run's
    assert report_folder(str(recipe_path), None, None, None).root == tmp_path / "out"
    (tmp_path / "m").mkdir()
    assert report_folder(str(recipe_path), str(tmp_path / "m"), None, None).root == tmp_path / "m" / "pofe-eval"
    assert report_folder(str(recipe_path), None, str(tmp_path / "e"), None).root == tmp_path / "e"
    with pytest.raises(ValueError, match="is not a local folder: give --output"):
        report_folder(str(recipe_path), "org/model", None, None)
