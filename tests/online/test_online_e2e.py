"""Online RRHF and SPPO through the real `axolotl train`, on the demo's toy task: they learn,
each refresh is written as it was trained on (scores checked against an independent scoring of
the written token ids), and a killed run resumes on what it was training on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pofe.demo.stages import prepare
from pofe.online.refresh import LOGP, LOGP_BASE, TOKENS, read_refresh
from tests.helpers import AXOLOTL_ENV, ROOT, assert_float_close, load_llama, log_history, naive_logps, run_axolotl

pytestmark = pytest.mark.e2e


def _toy(tmp_path: Path, name: str, **changes) -> tuple[Path, dict, list[dict]]:
    """The shipped recipe `name` with `changes` (a `pofe:` dict merges into its block), written in
    tmp_path beside the demo's tiny model and prompts (seed 0)."""
    recipe = yaml.safe_load((ROOT / "recipes" / name).read_text())
    pofe = changes.pop("pofe", {})
    recipe.update(changes)
    recipe["pofe"].update(pofe)
    recipe = {
        k: str(tmp_path / v) if k in ("base_model", "output_dir", "dataset_prepared_path") else v
        for k, v in recipe.items()
    }
    recipe["datasets"][0]["path"] = str(tmp_path / recipe["datasets"][0]["path"])
    rows = prepare(recipe, seed=0)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(recipe))
    return path, recipe, rows


def _refreshes(output_dir: Path) -> list[tuple]:
    return [read_refresh(f) for f in sorted((output_dir / "online").glob("refresh-*"))]


def _scored(rows: list[dict], column: str) -> torch.Tensor:
    """(rows, K_max) of one rows.jsonl column, NaN past a row's candidates: float32, the dtype the
    trainer scored in."""
    table = torch.full((len(rows), max(len(r[column]) for r in rows)), float("nan"))
    for j, r in enumerate(rows):
        table[j, : len(r[column])] = torch.tensor(r[column])
    return table


def _independent(model_dir: str, rows: list[dict]) -> torch.Tensor:
    """The written token ids scored by a plain forward of `model_dir` (`naive_logps`)."""
    tokens = [{"row_id": j, **r[TOKENS]} for j, r in enumerate(rows)]
    return naive_logps(load_llama(Path(model_dir)), tokens)


@pytest.mark.xdist_group("demo")
@pytest.mark.parametrize(
    ("title", "at_least"),
    # greedy reward on the 60 training prompts after training, from 0.000 before; measured over
    # model and prompt seeds 0, 1, 2 (python -m pofe.demo --online --seed s): see the README
    [("RRHF online", 0.3), ("SPPO online", 0.1)],
)
def test_online_training_learns_the_toy_and_writes_each_refresh(demo_console, title, at_least):
    """The shipped online recipes as `make demo` trains them (the `demo_console` fixture: seed 0,
    the real `axolotl train`)."""
    run = demo_console.run(title)
    before, after = run["before"]["train"]["mean_reward"], run["after"]["train"]["mean_reward"]
    assert before == 0.0 and after >= at_least, (before, after)
    cfg = yaml.safe_load((demo_console.root / run["recipe"]).read_text())
    cfg = {k: str(demo_console.root / v) if k in ("base_model", "output_dir") else v for k, v in cfg.items()}
    train_log = (demo_console.demo / "logs" / f"{title.lower().replace(' ', '-')}-train.log").read_text()

    refreshes = _refreshes(Path(cfg["output_dir"]))
    # 60 prompts in steps of 20: 3 steps an epoch, refresh_every 3, 50 epochs
    assert [w.start_step for w, _, _ in refreshes] == list(range(0, 150, 3))
    assert all(sorted(w.prompts) == list(range(60)) for w, _, _ in refreshes)
    rewards = [stats["candidate_reward_mean"] for _, _, stats in refreshes]
    assert rewards[0] < 0.01 and sum(rewards[-10:]) / 10 > rewards[0] + 0.02, rewards
    assert train_log.count("POFE: online refresh ") == 50

    # step 0: the policy is pi_0; its scores of the written ids are a plain forward's
    window, first, _ = refreshes[0]
    anchor_or_logp = _scored(first, LOGP)
    assert_float_close(anchor_or_logp, _independent(cfg["base_model"], first), n_terms=64 * 16)
    if "kl_coef" in cfg["pofe"]["online"]:
        # RRHF: pi_0 is the frozen base all along, and the policy has moved away from it by the end
        assert_float_close(_scored(first, LOGP_BASE), anchor_or_logp, n_terms=64 * 16)
        _, last, stats = refreshes[-1]
        assert_float_close(_scored(last, LOGP_BASE), _independent(cfg["base_model"], last), n_terms=64 * 16)
        ratio = [a - b for r in last for a, b in zip(r[LOGP], r[LOGP_BASE])]
        assert sum(ratio) / len(ratio) == pytest.approx(stats["kl_to_base"], rel=1e-9) and stats["kl_to_base"] > 1.0


@pytest.mark.newest  # transformers' training loop, whose get_batch_samples the trainer takes over
@pytest.mark.trl  # each refresh unwraps the policy with TRL's unwrap_model_for_generation
def test_a_killed_online_run_resumes_on_the_candidates_it_was_training_on(tmp_path):
    """Uninterrupted: 12 steps of 5 prompts, refreshes at steps 0, 4, 8, checkpoints at 6 and 12.
    Killed: only checkpoint-6 and the refreshes of steps 0 and 4 left (a kill at step 7). The
    resumed run reads step 4's refresh back for steps 7 and 8, samples step 8's again, and logs
    the uninterrupted run's losses."""
    changes = dict(
        micro_batch_size=5,
        num_epochs=1,
        max_steps=12,
        logging_steps=1,
        lr_scheduler="constant",
        warmup_steps=0,
        save_strategy="steps",
        save_steps=6,
        pofe={"online": {"refresh_every": 4, "kl_coef": 0.01}},
    )
    path, cfg, _ = _toy(tmp_path / "whole", "tiny-rrhf-online-cpu.yml", **changes)
    run_axolotl("train", str(path), cwd=tmp_path / "whole")
    whole = Path(cfg["output_dir"])
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "whole", killed)
    out = killed / whole.relative_to(tmp_path / "whole")
    shutil.rmtree(out / "checkpoint-12")
    shutil.rmtree(out / "online" / "refresh-0000008")
    resumed_cfg = {
        **yaml.safe_load(path.read_text()),
        "output_dir": str(out),
        "resume_from_checkpoint": str(out / "checkpoint-6"),
    }
    resumed_cfg["base_model"] = cfg["base_model"]
    resumed = killed / "resumed.yml"
    resumed.write_text(yaml.safe_dump(resumed_cfg))
    proc = run_axolotl("train", str(resumed), cwd=killed)
    assert "online: resuming in the refresh of step 4, read from its files" in proc.stdout + proc.stderr

    def losses(output: Path) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in log_history(output) if "loss" in e}

    def refreshed(output: Path) -> dict[int, float]:
        return {e["step"]: e["online/candidate_reward_mean"] for e in log_history(output) if "online/refresh" in e}

    assert sorted(losses(out)) == list(range(1, 13))
    assert {s: losses(out)[s] for s in range(7, 13)} == pytest.approx(
        {s: losses(whole)[s] for s in range(7, 13)}, rel=1e-6
    )
    assert refreshed(out)[8] == pytest.approx(refreshed(whole)[8], rel=1e-12)
    rows = lambda output: (output / "online" / "refresh-0000008" / "rows.jsonl").read_text()  # noqa: E731
    assert json.loads(rows(out).splitlines()[0])[LOGP] == pytest.approx(
        json.loads(rows(whole).splitlines()[0])[LOGP], rel=1e-5
    )


def test_two_zero3_ranks_each_sample_their_own_prompts_with_the_gathered_policy(tmp_path):
    """Two CPU processes under DeepSpeed ZeRO-3 (the shipped zero3_bf16.json), 10 prompts each a
    step: every refresh is two folders, one per rank, whose prompts split the epoch's 60; the
    logged counts add up over the ranks; and at step 0 each rank's policy and pi_0 (the frozen
    copy, partitioned like the policy and gathered for the refresh) score its ids as a plain
    forward of the base model does."""
    changes = dict(
        micro_batch_size=10,
        num_epochs=2,
        logging_steps=1,
        save_strategy="steps",
        save_steps=6,
        deepspeed=str(ROOT / "recipes" / "deepspeed" / "zero3_bf16.json"),
        eval_batch_size=3,
        pofe={"online": {"refresh_every": 3, "kl_coef": 0.01}},
    )
    path, cfg, _ = _toy(tmp_path, "tiny-rrhf-online-cpu.yml", **changes)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **AXOLOTL_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    launcher = ["--launcher", "torchrun", "--", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [str(bin_dir / "axolotl"), "train", str(path), *launcher],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = Path(cfg["output_dir"])
    for start in (0, 3):
        ranks = [read_refresh(out / "online" / f"refresh-{start:07d}" / f"rank-{r}") for r in (0, 1)]
        prompts = [p for window, _, _ in ranks for p in window.prompts]
        assert sorted(prompts) == list(range(60)) and all(len(w.prompts) == 30 for w, _, _ in ranks)
    logged = [e for e in log_history(out) if "online/refresh" in e]
    assert [(e["step"], e["online/prompts"]) for e in logged] == [(0, 60.0), (3, 60.0)]
    assert logged[0]["online/candidates"] == sum(
        read_refresh(out / "online" / "refresh-0000000" / f"rank-{r}")[2]["candidates"] for r in (0, 1)
    )
    for r in (0, 1):
        _, rows, _ = read_refresh(out / "online" / "refresh-0000000" / f"rank-{r}")
        plain = _independent(cfg["base_model"], rows)
        assert_float_close(_scored(rows, LOGP), plain, n_terms=64 * 16)
        assert_float_close(_scored(rows, LOGP_BASE), plain, n_terms=64 * 16)


@pytest.mark.parametrize("adapter", ["lora", "qlora"])
def test_under_an_adapter_pi_0_is_the_policy_with_its_adapter_disabled(tmp_path, adapter):
    """LoRA and QLoRA (4-bit on the CPU through bitsandbytes): the policy samples with its adapter;
    pi_0's log-probs at every refresh are the base model's (no copy loaded), and by the last
    refresh the adapted policy has moved away from them."""
    lora = {"adapter": adapter, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "lora_target_linear": True}
    if adapter == "qlora":
        lora["load_in_4bit"] = True
    changes = dict(
        micro_batch_size=10,
        num_epochs=2,
        learning_rate=1.0e-2,
        lora_mlp_kernel=False,
        lora_qkv_kernel=False,
        lora_o_kernel=False,
        lora_embedding_kernel=False,
        pofe={"online": {"refresh_every": 3, "kl_coef": 0.01}},
        **lora,
    )
    path, cfg, _ = _toy(tmp_path, "tiny-rrhf-online-cpu.yml", **changes)
    proc = run_axolotl("train", str(path), cwd=tmp_path)
    assert "frozen copy" not in proc.stdout + proc.stderr
    refreshes = _refreshes(Path(cfg["output_dir"]))
    assert [w.start_step for w, _, _ in refreshes] == [0, 3, 6, 9]  # 6 steps an epoch
    if adapter == "lora":  # 4-bit weights dequantised on the fly score apart from a float32 forward
        for _, rows, _ in refreshes:
            assert_float_close(_scored(rows, LOGP_BASE), _independent(cfg["base_model"], rows), n_terms=64 * 16)
    _, first, _ = refreshes[0]
    assert_float_close(_scored(first, LOGP), _scored(first, LOGP_BASE), n_terms=64 * 16)  # B = 0: pi = pi_0
    _, last, stats = refreshes[-1]
    assert stats["kl_to_base"] > 0.1, stats
