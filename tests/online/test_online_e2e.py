"""Online RRHF and SPPO through the real `axolotl train`, on the demo's toy task: they learn,
each refresh is written as it was trained on (scores checked against an independent scoring of
the written token ids), and a killed run resumes on what it was training on."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pofe.columns import PI_0_LOGPS
from pofe.demo.stages import prepare
from pofe.demo.task import answer, make_prompts, reward, verbose_reward
from pofe.demo.tiny import build_tokenizer
from pofe.files import read_jsonl
from pofe.online.refresh import LOGP, TOKENS, read_refresh
from tests.helpers import (
    AXOLOTL_ENV,
    ROOT,
    TESTS_ON_PATH,
    assert_float_close,
    float_tolerance,
    load_llama,
    log_history,
    naive_logps,
    run_axolotl,
    writes_a_user_turn,
)

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


def _console_refreshes(log: str) -> list[int]:
    """The refreshes whose line (`POFE: online refresh N at step S: ...`) a training's log shows."""
    return [int(n) for n in re.findall(r"POFE: online refresh (\d+) at step \d+: \d+ prompts", log)]


def _warned(output_dir: Path) -> set[int]:
    """The refreshes (1-based) with something to warn about, read from what each wrote: the judge's
    abstentions, prompts dropped, every pair tied, or a prompt whose every sample was empty."""
    warned = set()
    for number, folder in enumerate(sorted((output_dir / "online").glob("refresh-*")), start=1):
        _, _, stats = read_refresh(folder)
        tied = stats.get("pairs") and stats["pairs_tied"] == stats["pairs"]
        silent = any(
            g.get("sampled") and g.get("sampled_empty") == g["sampled"] for g in read_jsonl(folder / "generate.jsonl")
        )
        if stats["judge_abstentions"] or stats["prompts_dropped"] or tied or silent:
            warned.add(number)
    return warned


def _demo_recipe(demo_console, title: str) -> tuple[dict, list[dict], str]:
    """The recipe `make demo` trained as `title` (the `demo_console` fixture: seed 0, the real
    `axolotl train`), its paths made absolute; the prompt rows it trained on; its train stage's log."""
    root = demo_console.root
    cfg = yaml.safe_load((root / demo_console.run(title)["recipe"]).read_text())
    cfg = {
        k: str(root / v) if k in ("base_model", "output_dir", "dataset_prepared_path") else v for k, v in cfg.items()
    }
    cfg["datasets"] = [{**d, "path": str(root / d["path"])} for d in cfg["datasets"]]
    log = (demo_console.demo / "logs" / f"{title.lower().replace(' ', '-')}-train.log").read_text()
    return cfg, read_jsonl(Path(cfg["datasets"][0]["path"])), log


@pytest.mark.xdist_group("demo")
@pytest.mark.parametrize("title", ["RRHF online", "SPPO online"])
def test_online_training_learns_the_toy_and_writes_each_refresh(demo_console, title):
    """The shipped online recipes as `make demo` trains them. Greedy reward on the 60 training
    prompts after training, from 0.000 before, measured over model and prompt seeds 0, 1, 2
    (python -m pofe.demo --online --seed s): RRHF 0.955 / 1.000 / 0.969, SPPO 0.949 / 1.000 /
    1.000; the policy's samples' mean reward 0.000 -> 0.53-0.64 (RRHF) and 0.87-0.93 (SPPO)
    (docs/online.md). Seed 0 here."""
    run = demo_console.run(title)
    before, after = run["before"]["train"]["mean_reward"], run["after"]["train"]["mean_reward"]
    assert before == 0.0 and after >= 0.9, (before, after)
    cfg, _, train_log = _demo_recipe(demo_console, title)

    refreshes = _refreshes(Path(cfg["output_dir"]))
    # 60 prompts in steps of 20: 3 steps an epoch, refresh_every 3, one refresh an epoch
    epochs = cfg["num_epochs"]
    assert [w.start_step for w, _, _ in refreshes] == list(range(0, 3 * epochs, 3))
    assert all(sorted(w.prompts) == list(range(60)) for w, _, _ in refreshes)
    rewards = [stats["candidate_reward_mean"] for _, _, stats in refreshes]
    assert rewards[0] < 0.01 and sum(rewards[-10:]) / 10 > rewards[0] + 0.3, rewards
    # logging_steps 10 over refresh_every 3: a line for one refresh in 4, the monitor's, the last's, a warned one's
    expected = {*range(1, epochs + 1, 4), *range(1, epochs + 1, 10), epochs} | _warned(Path(cfg["output_dir"]))
    assert _console_refreshes(train_log) == sorted(expected)
    # monitor_every 10: refreshes 1, 11, 21, ... show their samples
    shown = re.findall(r"POFE: online refresh (\d+)'s samples \(prompt -> completion xN: judgement", train_log)
    assert shown == [str(n) for n in range(1, epochs + 1, 10)]

    # SPPO: each refresh's anchor is the sampling policy's scores, at step 0 pi_0's, a plain forward's.
    # RRHF without kl_coef scores nothing (pi_0 with kl_coef: the hacking test below, and ZeRO-3's)
    _, first, _ = refreshes[0]
    if cfg["rl"] == "sppo":
        assert_float_close(_scored(first, LOGP), _independent(cfg["base_model"], first), n_terms=64 * 16)
    else:
        assert not cfg["pofe"]["online"]["kl_coef"] and LOGP not in first[0] and PI_0_LOGPS not in first[0]


@pytest.mark.xdist_group("demo")
def test_nash_md_learns_the_toy_from_its_sft_pi_0(demo_console):
    """recipes/tiny-nash-md-online-cpu.yml as `make demo` trains it, from the model of
    recipes/tiny-sft-cpu.yml (its pi_0), against the exact-match verifier, sampling at every step
    (300 refreshes). Measured over model and prompt seeds 0, 1, 2 (python -m benchmarks.nash_md_peer):
    greedy exact match on the 60 training prompts 0.367 / 0.383 / 0.350 after SFT, 0.850 / 0.933 /
    0.783 after Nash-MD (0.717 / 0.817 / 0.717 with a refresh every 3 steps); the policy's samples'
    reward (exact matches) 0.053 / 0.097 / 0.059 at the first refresh, 0.763 / 0.872 / 0.756 at the
    300th. Seed 0 here; margins of 0.2 and 0.3."""
    sft, nash_md = demo_console.run("SFT"), demo_console.run("NASH-MD online")
    assert nash_md["before"] == sft["after"]  # pi_0 is the SFT model: its answers are Nash-MD's `before`
    before, after = sft["after"]["train"]["exact_match"], nash_md["after"]["train"]["exact_match"]
    assert after >= before + 0.2, (before, after)
    rewards = [stats["candidate_reward_mean"] for stats in nash_md["refreshes"]]
    assert len(rewards) == 300 and sum(rewards[-10:]) / 10 > rewards[0] + 0.3, rewards


@pytest.mark.xdist_group("demo")
def test_nash_md_sampling_every_step_shows_one_refresh_line_in_ten(demo_console):
    """recipes/tiny-nash-md-online-cpu.yml as `make demo` trains it: 300 refreshes, one a step, and
    logging_steps 10. Its log showed each refresh's line (300 of its 1,789 lines); now refreshes 1, 11,
    ..., 291 (the monitor's too), 300 (the last) and any the written files give a warning (none at
    seed 0), the first saying which and where the others are, and no line for a refresh's scoring.
    Every refresh's figures are still in the training log (the Trainer's printed `online/*` dicts,
    to axolotl's 4 significant digits). Measured: the log's 1,789 lines became 920."""
    cfg, _, log = _demo_recipe(demo_console, "NASH-MD online")
    out = Path(cfg["output_dir"])
    refreshes = _refreshes(out)
    assert len(refreshes) == 300
    assert _console_refreshes(log) == sorted({*range(1, 301, 10), 300} | _warned(out))
    first = next(line for line in log.splitlines() if "POFE: online refresh 1 at step 0: 20 prompts" in line)
    assert first.endswith(
        " [the console shows one refresh in 10 (logging_steps 10 / refresh_every 1), the last and any with a "
        f"warning; every refresh is in the training log (online/*) and in {out.relative_to(demo_console.root)}/"
        "online/refresh-*/refresh.json]"
    )
    # nor a line for each of a refresh's two scoring passes (the policy's and pi_0's: 600 at INFO)
    assert "log-probs for 20 rows" not in log
    logged = [ast.literal_eval(line) for line in log.splitlines() if line.startswith("{'online/refresh': ")]
    assert [int(e["online/refresh"]) for e in logged] == list(range(1, 301))
    for entry, (_, _, stats) in zip(logged, refreshes, strict=True):
        assert float(entry["online/candidate_reward_mean"]) == pytest.approx(stats["candidate_reward_mean"], rel=1e-3)
        assert float(entry["online/pairs_tied"]) == stats["pairs_tied"]


HACK_SEEDS, HACK_KL = (0, 1, 2), 0.3


@pytest.mark.xdist_group("demo")
def test_a_judge_with_a_blind_spot_is_hacked_online_without_kl_and_held_with_it(demo_console, tmp_path):
    """docs/online.md's demonstration of the RRHF paper's warning. pi_0 is the shipped recipe's
    trained model (it knows the training prompts' sums); 15 refreshes of online RRHF against
    `verbose_reward`, which pays 0.25 per character written after the number, with the monitors:
    `pofe.eval.judge2` the verifiable reward, the held-out prompts' sums as references. Training
    seeds 0-2, kl_coef 0 and 0.3. Measured (refresh 1 -> 15, refresh 1 alike in both arms): without
    KL the judge's reward of the samples rose 0.55-0.61 -> 0.85-0.88 (+0.24 to +0.32), the
    verifiable reward fell 0.41-0.50 -> 0.03-0.04 (-0.37 to -0.46) and the held-out perplexity rose
    4.39 -> 11.5-15.6 (x 2.62-3.55); with kl_coef 0.3 they ended at 0.54-0.65, 0.38-0.47 (-0.07 to
    +0.04) and 4.35-5.06 (x 0.99-1.15). The bounds lie between the arms: a judge's rise of 0.15, a
    verifiable fall of 0.2, a perplexity ratio of 1.7 (about the two arms' geometric mean)."""
    trained, rows, _ = _demo_recipe(demo_console, "RRHF online")
    held = [p for p in make_prompts(100, seed=0)[60:] if p not in {r["prompt"] for r in rows}]
    held_path = tmp_path / "held.jsonl"
    held_path.write_text("".join(json.dumps({"prompt": p, "answer": str(answer(p))}) + "\n" for p in held))
    curves = {}
    for kl in (0.0, HACK_KL):
        for seed in HACK_SEEDS:
            out = tmp_path / f"kl{kl}-seed{seed}"
            recipe = {
                **trained,
                "base_model": trained["output_dir"],
                "output_dir": str(out),
                "num_epochs": 15,
                "seed": seed,
                "pofe": {
                    **trained["pofe"],
                    "online": {**trained["pofe"]["online"], "kl_coef": kl, "monitor_every": 1},
                    "generate": {**trained["pofe"]["generate"], "seed": seed},
                    "judge": {"type": "python", "function": "pofe.demo.task:verbose_reward"},
                    "eval": {
                        "prompts": str(held_path),
                        "reference_column": "answer",
                        "judge2": {"type": "python", "function": "pofe.demo.task:reward"},
                    },
                },
            }
            path = tmp_path / f"kl{kl}-seed{seed}.yml"
            path.write_text(yaml.safe_dump(recipe))
            proc = run_axolotl("train", str(path), cwd=tmp_path)
            stats = [s for _, _, s in _refreshes(out)]
            curves[kl, seed] = {
                k: (stats[0][k], stats[-1][k])
                for k in ("candidate_reward_mean", "judge2_reward_mean", "reference_perplexity")
            }
    for seed in HACK_SEEDS:
        (judge0, judge), (true0, true), (ppl0, ppl) = curves[0.0, seed].values()
        _, (_, true_kl), (_, ppl_kl) = curves[HACK_KL, seed].values()
        assert judge > judge0 + 0.15 and true < true0 - 0.2 and ppl > 1.7 * ppl0, curves  # hacked
        assert true_kl > true0 - 0.2 and ppl_kl < 1.7 * ppl0, curves  # held
        assert curves[HACK_KL, seed]["reference_perplexity"][0] == ppl0  # the same pi_0 at refresh 1

    # the last run's (kl_coef 0.3, full fine-tuning): pi_0 is a frozen copy of the trained model all
    # along, and the policy has moved from it by the last refresh
    _, last, stats = _refreshes(out)[-1]
    assert_float_close(_scored(last, PI_0_LOGPS), _independent(trained["output_dir"], last), n_terms=64 * 16)
    assert stats["kl_to_pi_0"] > 0.01, stats

    # the monitors, checked on the last run: refresh 1's figures recomputed independently
    _, first_rows, first = read_refresh(out / "online" / "refresh-0000000")
    generated = read_jsonl(out / "online" / "refresh-0000000" / "generate.jsonl")
    sampled = [
        reward(g["prompt"], c) for g in generated for c, s in zip(g["candidates"], g["sources"]) if s == "policy"
    ]
    assert first["judge2_reward_mean"] == pytest.approx(sum(sampled) / len(sampled), rel=1e-12)
    # the chat template's user turn and generation prompt, then the sum and <|end|>: one token a character
    tokenizer = build_tokenizer()
    references = [
        {
            "row_id": j,
            "prompt_ids": tokenizer(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                ),
                add_special_tokens=False,
            )["input_ids"],
            "response_ids": [
                [*tokenizer(str(answer(p)), add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
            ],
        }
        for j, p in enumerate(held)
    ]
    logps = naive_logps(load_llama(Path(trained["output_dir"])), references)[:, 0]
    tokens = sum(len(r["response_ids"][0]) for r in references)
    expected = math.exp(-logps.sum().item() / tokens)
    assert first["reference_perplexity"] == pytest.approx(expected, rel=1e-4)
    records = read_jsonl(out / "online" / "monitor.jsonl")
    assert [r["step"] for r in records] == list(range(0, 45, 3))
    assert records[0]["reference_perplexity"] == first["reference_perplexity"]
    shown = records[0]["completions"]
    assert shown and {r["prompt"] for r in shown} <= {r["prompt"] for r in rows}
    assert all(r["reward"] == verbose_reward(r["prompt"], r["completion"]) for r in shown)
    assert all(r["judge2_reward"] == reward(r["prompt"], r["completion"]) for r in shown)
    console = proc.stdout + proc.stderr
    assert (
        "POFE: online refresh 15's samples (prompt -> completion xN: judgement; every one in online/monitor.jsonl)"
        in console
    )
    assert re.search(r"POFE: online refresh 15 at step 42: .*judge2 reward [\d.]+, reference perplexity", console)


def test_online_sppo_mixes_each_refreshs_anchor_toward_pi_0(tmp_path):
    """`pofe.anchor_mix: 0.5`: each refresh scores its candidates under pi_0 (the frozen base) as well
    as under the policy that sampled them, and SPPO regresses log pi - [0.5 log pi_t + 0.5 log pi_0].
    Refreshes at steps 0 and 2 (60 prompts, 20 a step); at the first step of the second window the
    policy is still pi_t, so the logged sppo/logratio of step 3 is 0.5 * mean(log pi_t - log pi_0)
    over the step's candidates, read from its rows.jsonl; at step 1 pi_t = pi_0 and it is 0."""
    changes = dict(
        max_steps=3,
        logging_steps=1,
        lr_scheduler="constant",
        warmup_steps=0,
        save_strategy="steps",
        save_steps=3,
        pofe={"anchor_mix": 0.5, "online": {"refresh_every": 2}},
    )
    path, cfg, _ = _toy(tmp_path, "tiny-sppo-online-cpu.yml", **changes)
    run_axolotl("train", str(path), cwd=tmp_path)
    (_, first, _), (window, rows, stats) = _refreshes(Path(cfg["output_dir"]))
    assert window.start_step == 2 and len(window.micro_batches) == 1
    assert_float_close(_scored(first, PI_0_LOGPS), _independent(cfg["base_model"], first), n_terms=64 * 16)
    assert_float_close(_scored(rows, PI_0_LOGPS), _independent(cfg["base_model"], rows), n_terms=64 * 16)
    ratio = _scored(rows, LOGP) - _scored(rows, PI_0_LOGPS)  # (rows, K_max), NaN past a row's candidates
    # the policy has moved from pi_0 by step 2 (either way), so the mixture is not 0 by construction
    mean = ratio.nanmean().item()
    assert stats["kl_to_pi_0"] == pytest.approx(mean, rel=1e-6) and abs(mean) > 0.1
    logged = {e["step"]: e["sppo/logratio"] for e in log_history(Path(cfg["output_dir"])) if "sppo/logratio" in e}
    magnitude = _scored(rows, LOGP).nan_to_num(0.0).abs().max().item()  # NaN past a row's candidates
    tolerance = float_tolerance(torch.float32, 64 * 16, magnitude)["atol"]
    assert logged[1] == pytest.approx(0.0, abs=tolerance)
    assert logged[3] == pytest.approx(0.5 * mean, abs=tolerance)


def test_a_refresh_cuts_samples_that_write_a_user_turn_and_says_how_many(tmp_path):
    """The shipped online RRHF recipe from a policy that answers every prompt "42" and then writes a
    user turn of its own ("<|user|>?") before its end of turn (`writes_a_user_turn`). The first
    refresh samples its window of 60 prompts (3 steps of 20) x 4: all 240 samples are cut before
    "<|user|>", counted in online/candidates_cut_at_user_turn and the refresh's console line, and
    trained as "42" on the ids of "4" and "2" followed by the template's end of turn. Before, they
    read "42?" and trained on the invented user turn's ids, and nothing said so."""
    path, cfg, _ = _toy(tmp_path, "tiny-rrhf-online-cpu.yml", max_steps=1, save_strategy="no")
    writes_a_user_turn(Path(cfg["base_model"]))
    console = run_axolotl("train", str(path), cwd=tmp_path)
    said = console.stdout + console.stderr
    assert re.search(
        r"POFE: online refresh 1 at step 0: 60 prompts, 300 candidates, .*240 samples cut where they "
        r"began a user turn",
        said,
    ), said[-3000:]
    [(window, rows, stats)] = _refreshes(Path(cfg["output_dir"]))
    assert len(window.prompts) == 60 and stats["candidates_cut_at_user_turn"] == 240
    tok = build_tokenizer()
    four_two = tok("42", add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids(["<|end|>"])
    for row in rows:
        assert row["responses"][1:] == ["42"] * 4  # the dataset's answer first
        assert row[TOKENS]["response_ids"][1:] == [four_two + end] * 4


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
        assert_float_close(_scored(rows, PI_0_LOGPS), plain, n_terms=64 * 16)


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
            assert_float_close(_scored(rows, PI_0_LOGPS), _independent(cfg["base_model"], rows), n_terms=64 * 16)
    _, first, _ = refreshes[0]
    assert_float_close(_scored(first, LOGP), _scored(first, PI_0_LOGPS), n_terms=64 * 16)  # B = 0: pi = pi_0
    _, last, stats = refreshes[-1]
    assert stats["kl_to_pi_0"] > 0.1, stats


def test_a_second_judge_that_raises_stops_the_run_naming_it_and_a_row(tmp_path):
    """`pofe.eval.judge2` (the monitor's second opinion) raising on every response: its abstentions are
    held to its max_abstention_rate as the recipe's judge's are, and the first monitored refresh stops the
    run naming its function, the count (60 prompts x 4 samples, the answer column left out: judge2 reads
    the policy's samples only, less those cut to nothing where the tiny model began a user turn at their
    first token: at most 12, about 1 in 100 at temperature 1 over its ~100-token vocabulary) and a row;
    nothing of the refresh is written. It used to train on, the judge2 reward missing from every line."""
    online = {"refresh_every": 3, "kl_coef": 0.0, "monitor_every": 1}
    judge2 = {"type": "python", "function": "tests.online.judges:raises"}
    path, cfg, _ = _toy(tmp_path, "tiny-rrhf-online-cpu.yml", pofe={"online": online, "eval": {"judge2": judge2}})
    proc = run_axolotl("train", str(path), cwd=tmp_path, check=False, env=TESTS_ON_PATH)
    assert proc.returncode != 0
    said = re.search(r"Error: (judge .*)$", proc.stderr, re.MULTILINE).group(1)
    counted = re.match(
        r"judge tests\.online\.judges:raises abstained on (\d+) of (\d+) candidates \(100%, limit "
        r"pofe\.eval\.judge2\.max_abstention_rate=0\.5\): top reason 'ZeroDivisionError' \((\d+) times\), e\.g\. dataset ",
        said,
    )
    assert counted, said
    n = int(counted[1])
    assert int(counted[2]) == int(counted[3]) == n and 240 - 12 <= n <= 240, said
    assert re.search(r"e\.g\. dataset \S+prompts\.jsonl, row \d+ \(0-based\)", said), said  # the prompt's file and row
    assert ": ZeroDivisionError: no verdict on " in said and said.endswith(
        "Fix the judge and run again (this refresh is not written: a resumed run samples and judges it again); "
        "raise pofe.eval.judge2.max_abstention_rate to accept more."
    )
    assert not _refreshes(Path(cfg["output_dir"]))
