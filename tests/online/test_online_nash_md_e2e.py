"""Online Nash-MD through the real `axolotl train` on the demo's toy (`recipes/tiny-nash-md-online-cpu.yml`,
4 epochs, from the random model with the graded reward): what each refresh wrote is what it logged, its preferences are the verifier's verdicts
on the written texts, and pi_0's log-probs are a plain forward of the base model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pofe.columns import PI_0_LOGPS
from pofe.demo.task import reward
from pofe.online.opponents import OPPONENTS
from pofe.online.refresh import LOGP
from tests.helpers import TESTS_ON_PATH, assert_float_close, log_history, run_axolotl
from tests.online.test_online_e2e import _independent, _refreshes, _scored, _toy

pytestmark = pytest.mark.e2e


def _hard(r: float, r_opp: float) -> float:
    """`judge.preferences: hard`, written out: 1 if r > r', 1/2 on a tie, 0 otherwise."""
    return 1.0 if r > r_opp else 0.5 if r == r_opp else 0.0


def test_nash_md_logs_what_its_refreshes_judged_and_scored(tmp_path):
    """Refreshes at steps 0, 3, 6, 9 (60 prompts in steps of 20). In each: every written
    preference is the toy's verifier on the sample's and its opponent's text (recomputed here from
    judge.jsonl), the logged `online/preference` is their mean over rows.jsonl and
    `online/kl_to_pi_0` the mean of its log-ratios. At step 0 the policy is pi_0: its log-probs
    and pi_0's of the written ids are one plain forward's, and the mixture's per-token KL from the
    policy is 0 (float32 log-softmaxes: below 1e-6); at step 9 the policy has moved from pi_0,
    whose log-probs are still the base model's, and the mixture from the policy (above 1e-4)."""
    changes = dict(num_epochs=4, logging_steps=1, save_strategy="steps", save_steps=12)  # a checkpoint: the log
    # pi_0 here is the random model (no SFT first), whose samples never hit a sum: the graded
    # reward's comparisons and a faster rate move it within 4 epochs, where exact_reward ties them all
    judge = {"type": "python", "function": "pofe.demo.task:reward", "preferences": "hard"}
    # a refresh every 3 steps (the recipe samples every step): 4 refreshes to recompute, not 12
    pofe = {"judge": judge, "online": {"refresh_every": 3}}
    path, cfg, _ = _toy(tmp_path, "tiny-nash-md-online-cpu.yml", learning_rate=5e-3, pofe=pofe, **changes)
    run_axolotl("train", str(path), cwd=tmp_path)
    out = Path(cfg["output_dir"])
    refreshes = _refreshes(out)
    assert [w.start_step for w, _, _ in refreshes] == [0, 3, 6, 9]
    logged = {e["step"]: e for e in log_history(out) if "online/refresh" in e}
    for window, rows, stats in refreshes:
        folder = out / "online" / f"refresh-{window.start_step:07d}"
        for judged in map(json.loads, (folder / "judge.jsonl").read_text().splitlines()):
            verdicts = [
                _hard(reward(judged["prompt"], y), reward(judged["prompt"], y_opp))
                for y, y_opp in zip(judged["responses"], judged[OPPONENTS], strict=True)
            ]
            assert judged["preferences"] == verdicts
        preferences = [p for row in rows for p in row["preferences"]]
        log_ratios = [a - b for row in rows for a, b in zip(row[LOGP], row[PI_0_LOGPS], strict=True)]
        entry = logged[window.start_step]
        assert entry["online/preference"] == pytest.approx(sum(preferences) / len(preferences), rel=1e-9)
        assert entry["online/kl_to_pi_0"] == pytest.approx(sum(log_ratios) / len(log_ratios), rel=1e-9)
        assert entry["online/mixture_kl"] == pytest.approx(stats["mixture_kl"], rel=1e-9)
    _, first, stats = refreshes[0]
    plain = _independent(cfg["base_model"], first)
    assert_float_close(_scored(first, LOGP), plain, n_terms=64 * 16)
    assert_float_close(_scored(first, PI_0_LOGPS), plain, n_terms=64 * 16)
    assert abs(stats["mixture_kl"]) < 1e-6
    _, last, stats = refreshes[-1]
    assert_float_close(_scored(last, PI_0_LOGPS), _independent(cfg["base_model"], last), n_terms=64 * 16)
    assert stats["kl_to_pi_0"] > 0.1 and stats["mixture_kl"] > 1e-4


def test_a_judge_that_ties_every_pair_is_warned_at_each_refresh(tmp_path):
    """A judge giving every response one reward ties every pair (preference 1/2: no push either way).
    The run trains to its end, as a verifier no sample passes yet would, and each refresh's console says
    so with its counts, which are rows.jsonl's (3 refreshes of 20 prompts x 4 samples, every pair written;
    the count read back from the files, not assumed), and what to check."""
    judge = {"type": "python", "function": "tests.online.judges:same_for_all", "preferences": "hard"}
    online = {"refresh_every": 1, "kl_coef": 0.05}
    generate = {"backend": "transformers", "num_candidates": 4, "max_new_tokens": 3}
    pofe = {"judge": judge, "online": online, "generate": generate}
    path, cfg, _ = _toy(tmp_path, "tiny-nash-md-online-cpu.yml", pofe=pofe, num_epochs=1, warmup_steps=0)
    proc = run_axolotl("train", str(path), cwd=tmp_path, env=TESTS_ON_PATH)
    out = Path(cfg["output_dir"])
    refreshes = _refreshes(out)
    assert [w.start_step for w, _, _ in refreshes] == [0, 1, 2]
    warned = [line for line in proc.stdout.splitlines() if "the judge tied all" in line]
    assert len(warned) == 3
    for number, ((window, rows, _), line) in enumerate(zip(refreshes, warned, strict=True), start=1):
        preferences = [p for row in rows for p in row["preferences"]]
        assert set(preferences) == {0.5} and len(rows) == 20
        folder = out / "online" / f"refresh-{window.start_step:07d}"
        assert line.endswith(
            f"POFE: online refresh {number} at step {window.start_step}: the judge tied all {len(preferences)} pairs "
            f"of 20 prompts (every preference 1/2), so the steps until the next refresh learn nothing from it: only "
            f"the KL to pi_0 (pofe.online.kl_coef) moves the policy. The pairs are in {folder / 'judge.jsonl'}. The "
            "judge (tests.online.judges:same_for_all) gave each sample and its opponent the same reward (their "
            "rewards and opponent_rewards there): a verifier that every sample fails, or passes, ties them all. "
            "Check its rewards on these samples; start from a pi_0 that solves some prompts (an SFT first, as "
            "recipes/tiny-sft-cpu.yml does for recipes/tiny-nash-md-online-cpu.yml), or give the judge a graded "
            "reward."
        )
        summary = next(
            x for x in proc.stdout.splitlines() if f"online refresh {number} at step" in x and "prompts," in x
        )
        assert f"{len(preferences)} of {len(preferences)} pairs tied" in summary
