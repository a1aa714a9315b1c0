"""Evaluation maths: model-vs-model win rates from rewards, sequence log-probs vs a naive loop."""

from __future__ import annotations

import math

import pytest
import torch

from pofe.run.evaluation.answers import sequence_logps
from pofe.run.evaluation.statistics import block_win_matrix, find_cycles, win_matrix_from_rewards


def sig(x):
    return 1 / (1 + math.exp(-x))


def test_win_matrix_from_rewards_by_hand():
    """One prompt, two models, two samples each: model 0 scores (0, 1), model 1 scores (1, 1).

    W[1, 0] = mean over the 4 sample pairs of sigmoid(r1 - r0)
            = (sigmoid(1) + sigmoid(0) + sigmoid(1) + sigmoid(0)) / 4 = (sigmoid(1) + 0.5) / 2,
    W[0, 1] = 1 - W[1, 0], diagonal 1/2."""
    r = torch.tensor([[[0.0, 1.0], [1.0, 1.0]]])  # (P=1, M=2, S=2)
    w = win_matrix_from_rewards(r)
    expected = (sig(1) + 0.5) / 2
    assert w[1, 0].item() == pytest.approx(expected)
    assert w[0, 1].item() == pytest.approx(1 - expected)
    assert w.diagonal().tolist() == [0.5, 0.5]


def test_win_matrix_averages_prompts_and_skips_abstentions():
    """Prompt 0: r = (2, 0) -> W[0, 1] = sigmoid(2); prompt 1: model 1 abstained (NaN) -> the
    prompt gives no verdict on that pair and W[0, 1] = sigmoid(2) still."""
    r = torch.tensor([[[2.0], [0.0]], [[1.0], [float("nan")]]])  # (P=2, M=2, S=1)
    w = win_matrix_from_rewards(r)
    assert w[0, 1].item() == pytest.approx(sig(2))
    assert w[1, 0].item() == pytest.approx(1 - sig(2))


def test_block_win_matrix_from_a_pairwise_judge_can_cycle():
    """A pairwise judge with rock-paper-scissors preferences (0 > 1 > 2 > 0 at 0.8) over one
    response per model gives a model matrix that find_cycles flags; Bradley-Terry on any
    scalar reward cannot."""
    pref = torch.full((1, 3, 3), 0.5, dtype=torch.float64)
    for a, b in ((0, 1), (1, 2), (2, 0)):
        pref[0, a, b], pref[0, b, a] = 0.8, 0.2
    w = block_win_matrix(pref, num_models=3, num_samples=1)
    assert find_cycles(w) == [(0, 1, 2)]
    bt = win_matrix_from_rewards(torch.tensor([[[0.3], [0.1], [0.9]]]))
    assert find_cycles(bt) == []


def test_block_win_matrix_checks_shape():
    with pytest.raises(ValueError, match="expected"):
        block_win_matrix(torch.zeros(1, 5, 5), num_models=2, num_samples=2)


def test_sequence_logps_matches_a_naive_loop(tiny_model):
    """Batched, right-padded scoring equals scoring each sequence alone, token by token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompts = [[1, 10, 11, 12], [1, 20], [1, 30, 31]]
    responses = [[40, 41], [50, 51, 52, 2], [60]]
    got = sequence_logps(model, prompts, responses, batch_size=3)
    for p, r, g in zip(prompts, responses, got):
        ids = torch.tensor([p + r])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        naive = sum(logp[len(p) - 1 + i, tok].item() for i, tok in enumerate(r))
        assert g == pytest.approx(naive, abs=1e-4)


def test_judge_models_with_a_python_judge():
    """The path both `pofe.judge` and `pofe.eval.judge2` take: texts[p][m][s] are scored
    model-major and the (M, M) matrix follows from the rewards by Bradley-Terry. A python judge
    reads the dataset's prompt, as in the judge stage: the rendered one would not parse (NaN)."""
    from pofe.run.evaluation.judging import judge_models
    from pofe_candidates import JudgeConfig
    from pofe_candidates.judges import make_judge

    prompts = ["1+2=", "3+4="]
    rendered = [f"<|user|>{p}<|assistant|>" for p in prompts]
    texts = [[["3", "x"], ["2", "3"]], [["7", "7"], ["9", "8"]]]  # (P=2, M=2, S=2)
    out = judge_models(
        make_judge(JudgeConfig(type="python", function="pofe.demo.task:reward")), prompts, rendered, texts
    )
    # rewards: "3" right (1.0), "x" not a number (0), "2" off by one (0.25), "9" off by 2 (1/6), "8" (0.25)
    got = torch.tensor(out["rewards"], dtype=torch.float64)
    want = torch.tensor([[[1.0, 0.0], [0.25, 1.0]], [[1.0, 1.0], [0.5 / 3, 0.25]]], dtype=torch.float64)
    assert torch.allclose(got, want)
    assert torch.allclose(torch.tensor(out["win_matrix"], dtype=torch.float64), win_matrix_from_rewards(want))
    assert out["method"] == "bradley_terry"


def test_a_judge_pass_in_chunks_gives_the_same_verdicts_and_a_progress_bar(capsys, tmp_path, monkeypatch):
    """40 prompts judged 16 at a time (a bar counting them to 40/40) give the verdicts of one
    call; a missing verdict in the third chunk is named by its position among all 40 prompts
    (32 + 1 = 33), not within its chunk (1)."""
    from pofe.demo.task import make_prompts
    from pofe.run.evaluation.judging import JUDGE_CHUNK, judge_pass
    from pofe_candidates.config import JudgeConfig
    from pofe_candidates.judges import JudgeError, apply_judge, make_judge

    prompts = make_prompts(40, seed=3)
    responses = [["19", "7"] for _ in prompts]
    judge = make_judge(JudgeConfig(type="python", function="pofe.demo.task:reward"))
    whole = apply_judge(judge, prompts, prompts, responses)
    capsys.readouterr()
    assert judge_pass(judge, prompts, prompts, responses, "judge the test") == whole
    err = capsys.readouterr().err
    assert JUDGE_CHUNK == 16 and "pofe eval judge the test: 100%" in err and "| 40/40 [" in err

    (tmp_path / "nan_at.py").write_text(
        "def reward(prompt, response):\n    return float('nan') if prompt == PROMPT else 1.0\n"
        f"PROMPT = {prompts[33]!r}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    strict = make_judge(JudgeConfig(type="python", function="nan_at:reward", allow_abstain=False))
    with pytest.raises(JudgeError, match="judge gave no verdict for prompt 33, "):
        judge_pass(strict, prompts, prompts, responses, "judge")


def abstaining_judge(tmp_path, monkeypatch):
    """A python judge `abstains_on_x:reward`: NaN (an abstention) for the answer "x", else 1.0."""
    (tmp_path / "abstains_on_x.py").write_text(
        "def reward(prompt, response):\n    return float('nan') if response == 'x' else 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from pofe_candidates.config import JudgeConfig

    return JudgeConfig(type="python", function="abstains_on_x:reward")


def test_held_out_abstentions_over_the_limit_stop_the_evaluation(tmp_path, monkeypatch):
    """Issue 50: 13 of 16 held-out rewards NaN (the judge abstained) exited 0, the choice made on 3
    answers, the abstentions uncounted. Over the judge's max_abstention_rate (0.5) the evaluation
    stops, naming the judge, the count, the reason with its prompt and the setting; every answer
    abstained stops it whatever the limit; judge2's limit is named as pofe.eval.judge2's."""
    from pofe.run.evaluation.judging import judge_models
    from pofe_candidates.abstentions import NoJudgeSignal
    from pofe_candidates.judges import make_judge

    cfg = abstaining_judge(tmp_path, monkeypatch)
    prompts = [f"{i}+1=" for i in range(8)]
    texts = [[["x"], ["x"]] for _ in range(8)]  # (P=8, M=2, S=1)
    texts[5][1], texts[6][1], texts[7][0] = ["1"], ["1"], ["1"]  # 3 answers scored, 13 abstained
    with pytest.raises(NoJudgeSignal) as caught:
        judge_models(make_judge(cfg), prompts, prompts, texts, cfg=cfg)
    message = str(caught.value)
    assert message.startswith(
        "judge abstains_on_x:reward abstained on 13 of 16 answers (81%, limit pofe.judge.max_abstention_rate=0.5): "
    )
    assert "e.g. judge the held-out answers, prompt 0: " in message
    assert "raise pofe.judge.max_abstention_rate to accept more" in message
    with pytest.raises(NoJudgeSignal, match="limit pofe.eval.judge2.max_abstention_rate=0.5"):
        judge_models(make_judge(cfg), prompts, prompts, texts, "judge2", cfg=cfg, setting="pofe.eval.judge2")
    everything = [[["x"], ["x"]] for _ in range(8)]
    lenient = cfg.model_copy(update={"max_abstention_rate": 1.0})
    with pytest.raises(NoJudgeSignal, match="abstained on 16 of 16 answers"):
        judge_models(make_judge(lenient), prompts, prompts, everything, cfg=lenient)


def test_held_out_abstentions_under_the_limit_are_counted(tmp_path, monkeypatch):
    """3 of 16 answers abstained (under 0.5): the means are over the 13 scored answers, and
    eval.json counts both per model; the console's held-out line says so."""
    from pofe.run.evaluation.judging import judge_models, mean_reward_per_model, reward_counts
    from pofe.run.evaluation.records import with_readings
    from pofe.run.report import held_out_summary
    from pofe_candidates.judges import make_judge

    cfg = abstaining_judge(tmp_path, monkeypatch)
    prompts = [f"{i}+1=" for i in range(8)]
    texts = [[["1"], ["1"]] for _ in range(8)]
    texts[0][1], texts[1][1], texts[2][1] = ["x"], ["x"], ["x"]  # pi_1 abstained on 3 of its 8
    out = judge_models(make_judge(cfg), prompts, prompts, texts, cfg=cfg)
    assert mean_reward_per_model(out["rewards"], 2) == [1.0, 1.0]
    counts = reward_counts(out["rewards"], 2)
    assert counts == {"reward_count": [8, 5], "abstained": [0, 3]}
    ev = with_readings(
        {
            "models": [{"name": "pi_0"}, {"name": "pi_1"}],
            "mean_reward": [1.0, 1.0],
            "kl_to_pi_0": [0.0, 0.25],
            **counts,
            "win_matrix": out["win_matrix"],
            "cycle_threshold": 0.5,
            "decoding": {"num_samples": 1, "temperature": 1.0},
        }
    )
    # issue 49: said to be sampled answers' rewards, not the demo's greedy ones
    assert held_out_summary({"eval": ev})[0] == (
        "  held-out prompts, sampled answers (1 a prompt at temperature 1): pi_0 reward 1.000 KL 0.000, pi_1 reward "
        "1.000 (5 of 8 answers, 3 abstained) KL 0.250"
    )


def test_a_pairwise_judges_abstentions_are_counted_by_pairs():
    """A pairwise judge abstains on pairs of answers: 3 answers (3 pairs) per prompt, 2 prompts,
    4 of the 6 pairs without a preference are over the limit, named as pairs; 1 of 6 is not."""
    from pofe.run.evaluation.judging import check_verdicts
    from pofe_candidates.abstentions import NoJudgeSignal
    from pofe_candidates.config import JudgeConfig
    from pofe_candidates.judges import PairwiseVerdict

    cfg = JudgeConfig(type="pairrm", model="llm-blender/PairRM")

    def verdict(abstained: int) -> PairwiseVerdict:
        return PairwiseVerdict(torch.full((3, 3), 0.5), abstained, ("no verdict",) * abstained)

    with pytest.raises(NoJudgeSignal) as caught:
        check_verdicts([verdict(2), verdict(2)], cfg, "pofe.judge", "judge the held-out answers")
    assert str(caught.value).startswith(
        "judge pairrm abstained on 4 of 6 pairs of answers (67%, limit pofe.judge.max_abstention_rate=0.5): "
        "top reason "
    )
    assert "e.g. judge the held-out answers, prompt 0: no verdict" in str(caught.value)
    tally = check_verdicts([verdict(1), verdict(0)], cfg, "pofe.judge", "judge the held-out answers")
    assert (tally.verdicts, tally.abstained) == (6, 1)
