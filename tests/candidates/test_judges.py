"""Scalar judges (python, reward model), the both-order combination, and `apply_judge`, with hand numbers."""

from __future__ import annotations

import math
import time

import pytest
import torch

from pofe.errors import PofeError
from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges import apply_judge, make_judge
from pofe_candidates.judges.interface import Abstain, JudgeError, JudgeStats
from pofe_candidates.judges.llm import parse_score
from pofe_candidates.judges.pairwise import (
    combine_orders,
    parse_verdict,
    preferences_both_orders,
    verdict_from_logprobs,
)
from pofe_candidates.judges.python import PythonJudge, PythonPairwiseJudge
from pofe_candidates.judges.user_functions import load_function
from pofe_candidates.win_rates import win_rates
from tests.helpers import approx_float


def test_python_judge_scores_and_abstains():
    def fn(prompt, response):
        if response == "boom":
            raise ValueError("bad input")
        if response == "nan":
            return float("nan")
        return len(response)

    j = PythonJudge(fn)
    out = j.score(["p1", "p2"], [["a", "bb"], ["boom", "nan", "ccc"]])
    assert out[0] == [1.0, 2.0] and out[1][2] == 3.0
    assert isinstance(out[1][0], Abstain) and "ValueError: bad input" in out[1][0].reason
    assert isinstance(out[1][1], Abstain) and "non-finite" in out[1][1].reason
    assert j.stats.abstentions == 2 and j.stats.calls == 5


def test_python_judge_no_abstain_names_the_row():
    j = PythonJudge(lambda p, r: 1 / 0, allow_abstain=False)
    with pytest.raises(JudgeError, match="prompt 0, candidate 0"):
        j.score(["p"], [["a"]])


def test_load_function_errors():
    assert load_function("pofe.demo.task:reward")("1+1=", "2") == 1.0
    with pytest.raises(ImportError, match="cannot import module 'no_such_mod'"):
        load_function("no_such_mod:f")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        load_function("pofe.demo.task:nope")
    # a typo in the recipe: POFE's message alone on the console (a PofeError), naming the function meant
    with pytest.raises(PofeError, match="has no attribute 'rewrd'. Did you mean 'reward'"):
        load_function("pofe.demo.task:rewrd")


def test_reward_model_batched_equals_independent_forward(tiny_reward_model):
    """Batched, padded scores == one unpadded forward per pair, pooling the last token by hand."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pofe_candidates.judges.reward_model import RewardModelJudge

    prompts = ["What is 2+2?", [{"role": "user", "content": "Hi there"}]]
    responses = [["4", "four, I think", "5"], ["hello", "a much longer greeting with words"]]
    judge = RewardModelJudge(str(tiny_reward_model), batch_size=2)
    got = judge.score(prompts, responses)
    assert [len(g) for g in got] == [3, 2]

    tok = AutoTokenizer.from_pretrained(tiny_reward_model)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model).eval()
    for prompt, rs, scores in zip(prompts, responses, got):
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        for r, s in zip(rs, scores):
            text = tok.apply_chat_template(msgs + [{"role": "assistant", "content": r}], tokenize=False)
            assert text.endswith(f"<|assistant|>{r}<|end|>")
            ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
            with torch.no_grad():
                hidden = model.model(input_ids=ids).last_hidden_state  # (1, T, H)
                ref = model.score(hidden[:, -1]).item()  # (1, 1): last token's score
            assert s == approx_float(ref, 64 * 64)  # float32 sums over width 64 x < 64 tokens


def test_combine_orders_hand_matrix():
    """first_wins (y_i shown first): F = [[-, .9, .6], [.5, -, .8], [.2, .4, -]].
    P[0,1] = (.9 + 1 - .5)/2 = .7;  P[0,2] = (.6 + 1 - .2)/2 = .7;  P[1,2] = (.8 + 1 - .4)/2 = .7.
    Win rates w_i = mean_j P[i, j] (diag 1/2): w0 = (.5+.7+.7)/3 = .6333, w1 = (.3+.5+.7)/3 = .5,
    w2 = (.3+.3+.5)/3 = .3667."""
    F = torch.tensor([[0.0, 0.9, 0.6], [0.5, 0.0, 0.8], [0.2, 0.4, 0.0]])
    v = combine_orders(F)
    P = v.matrix
    assert v.abstained_pairs == 0
    assert torch.allclose(P, torch.tensor([[0.5, 0.7, 0.7], [0.3, 0.5, 0.7], [0.3, 0.3, 0.5]], dtype=torch.float64))
    assert torch.allclose(P + P.T, torch.ones(3, 3, dtype=torch.float64))
    assert torch.allclose(win_rates(P), torch.tensor([0.6 + 0.1 / 3, 0.5, 0.3 + 0.2 / 3], dtype=torch.float64))


def test_combine_orders_position_bias_cancels():
    """A judge adding +0.2 to whichever response is shown first gives back the true matrix."""
    Q = torch.tensor([[0.5, 0.6, 0.3], [0.4, 0.5, 0.1], [0.7, 0.9, 0.5]], dtype=torch.float64)
    biased = Q + 0.2 * (1 - torch.eye(3, dtype=torch.float64))
    assert torch.allclose(combine_orders(biased).matrix, Q)


def test_combine_orders_abstentions():
    """(0,1) one order missing -> 1 - F[1,0] = 1 - .3 = .7; (0,2) both missing -> tie, counted."""
    nan = float("nan")
    F = torch.tensor([[0.0, nan, nan], [0.3, 0.0, 0.6], [nan, 0.2, 0.0]])
    v = combine_orders(F)
    assert v.abstained_pairs == 1
    assert v.matrix[0, 1].item() == pytest.approx(0.7)
    assert v.matrix[0, 2].item() == 0.5 and v.matrix[2, 0].item() == 0.5
    assert v.matrix[1, 2].item() == pytest.approx((0.6 + 1 - 0.2) / 2)
    assert not torch.isnan(v.matrix).any()


def test_preferences_both_orders_calls_every_ordered_pair():
    seen = []

    def pair_fn(items):
        seen.extend(items)
        return [1.0 if len(a) > len(b) else 0.0 for _, a, b in items]  # longer wins, no bias

    stats = JudgeStats()
    out = preferences_both_orders(pair_fn, ["p", "q"], [["a", "bbb", "cc"], ["x", "yy"]], stats)
    assert len(seen) == 3 * 2 + 2 * 1 and stats.calls == 8
    assert out[0].matrix.shape == (3, 3) and out[1].matrix.shape == (2, 2)
    assert win_rates(out[0].matrix).argmax().item() == 1  # "bbb"


def test_parsers():
    assert parse_score("Score: 7/10", 1, 10) == 7.0
    assert "out of range" in parse_score("42", 1, 10)
    assert "unparseable" in parse_score("great!", 1, 10)
    assert parse_verdict("[[A]]") == 1.0 and parse_verdict(" B is better") == 0.0
    assert "unparseable" in parse_verdict("Both are fine")
    assert parse_verdict("Answer") != 1.0  # the A of a word is not a verdict
    lp = [
        {"token": " A", "logprob": math.log(0.3)},
        {"token": "B", "logprob": math.log(0.1)},
        {"token": "x", "logprob": math.log(0.05)},
    ]
    assert verdict_from_logprobs(lp) == pytest.approx(0.75)
    only_a = [{"token": "A", "logprob": math.log(0.3)}, {"token": "x", "logprob": math.log(0.1)}]
    assert verdict_from_logprobs(only_a) == pytest.approx(0.75)  # B bounded by the lowest listed (0.1)
    assert verdict_from_logprobs([{"token": "x", "logprob": -1.0}]) is None


_BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}


def rps(prompt, response_a, response_b):
    """Rock-paper-scissors: P(a beats b) is 1, 0 or 1/2 (same hand); non-transitive."""
    if response_a == response_b:
        return 0.5
    return 1.0 if _BEATS[response_a] == response_b else 0.0


def test_python_pairwise_judge_rock_paper_scissors():
    """Candidates (rock, rock, paper, scissors). Win rates w_i = mean_j P[i, j], diagonal 1/2:
    rock     (1/2 + 1/2 + 0 + 1) / 4 = 0.5   (the other rock ties)
    paper    (1 + 1 + 1/2 + 0) / 4   = 0.625
    scissors (0 + 0 + 1 + 1/2) / 4   = 0.375
    Paper leads because the sampled set holds two rocks: no reward gives these win rates
    with rock > scissors > paper > rock. Every ordered pair judged: 4 x 3 = 12 calls."""
    j = make_judge(JudgeConfig(type="python_pairwise", function=f"{__name__}:rps"))
    (verdict,) = j.preferences(["play"], [["rock", "rock", "paper", "scissors"]])
    torch.testing.assert_close(win_rates(verdict.matrix), torch.tensor([0.5, 0.5, 0.625, 0.375], dtype=torch.float64))
    assert (
        verdict.matrix[2, 3].item() == 0.0
        and verdict.matrix[3, 0].item() == 0.0
        and verdict.matrix[0, 3].item() == 1.0
    )
    assert j.stats.calls == 12 and j.stats.abstentions == 0


def test_python_pairwise_judge_abstains_and_uses_the_other_order():
    """(a, b) raises, (b, a) gives 0.8 -> P[a, b] = 1 - 0.8 = 0.2 from one order.
    (a, c) non-finite, (c, a) 1.5 out of range: the pair abstains, P = 1/2.
    (b, c) 0.9 and (c, b) 0.3: P[b, c] = (0.9 + 1 - 0.3) / 2 = 0.8."""
    table = {
        ("a", "b"): "raise",
        ("b", "a"): 0.8,
        ("a", "c"): float("nan"),
        ("c", "a"): 1.5,
        ("b", "c"): 0.9,
        ("c", "b"): 0.3,
    }

    def fn(prompt, x, y):
        v = table[x, y]
        if v == "raise":
            raise KeyError("no such hand")
        return v

    j = PythonPairwiseJudge(fn)
    (verdict,) = j.preferences(["p"], [["a", "b", "c"]])
    assert verdict.matrix[0, 1].item() == pytest.approx(0.2)
    assert verdict.matrix[0, 2].item() == 0.5 and verdict.abstained_pairs == 1
    assert verdict.matrix[1, 2].item() == pytest.approx(0.8)
    assert j.stats.abstentions == 3 and j.stats.calls == 6
    assert j.stats.reasons == {"KeyError": 1, "non-finite P(a beats b)": 1, "out of range": 1}
    assert verdict.abstain_reasons == ("non-finite P(a beats b): nan",)  # the (a, c) order's reason
    strict = PythonPairwiseJudge(fn, allow_abstain=False, name="m:fn")
    with pytest.raises(JudgeError, match=r"prompt 0, candidates 0 and 1, m:fn: KeyError"):
        strict.preferences(["p"], [["a", "b", "c"]])


def test_judge_preferences_defaults_and_combinations():
    """Each judge's default, and a formation that does not fit the judge named with both."""
    assert JudgeConfig(type="python", function="m:f").preferences == "bradley_terry"
    assert JudgeConfig(type="python_pairwise", function="m:f").preferences == "both_orders"
    assert JudgeConfig(type="pairrm", model="llm-blender/PairRM").preferences == "authors"
    assert JudgeConfig(type="pairwise_llm", base_url="http://h/v1").preferences == "both_orders"
    assert JudgeConfig(type="pairrm", model="m", preferences="both_orders").preferences == "both_orders"
    hard = JudgeConfig(type="reward_model", model="m", preferences="hard")
    assert hard.preferences == "hard" and hard.preferences_temperature == 1.0
    with pytest.raises(
        ValueError,
        match="judge.preferences: hard does not apply to judge.type: pairrm; it takes authors or both_orders",
    ):
        JudgeConfig(type="pairrm", model="m", preferences="hard")
    with pytest.raises(ValueError, match="preferences: authors does not apply to judge.type: python;"):
        JudgeConfig(type="python", function="m:f", preferences="authors")
    with pytest.raises(ValueError, match="judge.type: pairwise_llm; it takes both_orders"):
        JudgeConfig(type="pairwise_llm", base_url="http://h/v1", preferences="authors")
    with pytest.raises(ValueError, match="preferences_temperature applies to preferences: bradley_terry only"):
        JudgeConfig(type="python", function="m:f", preferences="hard", preferences_temperature=0.1)
    with pytest.raises(ValueError, match="judge.type=python_pairwise needs judge.function"):
        JudgeConfig(type="python_pairwise")
    with pytest.raises(ValueError, match="preferences_temperature: 0.0 is out of range; set a finite number > 0.0"):
        JudgeConfig(type="python", function="m:f", preferences_temperature=0.0)
    for cfg in (hard, JudgeConfig(type="pairrm", model="m")):  # a dumped config (as axolotl re-validates) reads back
        assert JudgeConfig(**cfg.model_dump()) == cfg


# ---- apply_judge: what each judge is handed ------------------------------------------------


class Recorder:
    """A scalar judge scoring every response 1.0 and recording what it was called with."""

    def __init__(self, *, rendered: bool, columns: bool):
        self.reads_rendered_prompt, self.reads_columns = rendered, columns
        self.stats, self.calls = JudgeStats(), []

    def score(self, prompts, responses, **kwargs):
        self.calls.append((prompts, kwargs))
        return [[1.0] * len(r) for r in responses]


def test_apply_judge_gives_each_judge_the_prompt_form_and_columns_it_reads():
    """The flags pick the inputs: rendered prompts only for `reads_rendered_prompt`, columns
    only for `reads_columns` (a judge without the flag is never passed `columns=`)."""
    prompts = ["2+2=", [{"role": "user", "content": "1+3="}]]
    rendered = ["<|user|>2+2=<|assistant|>", "<|user|>1+3=<|assistant|>"]
    columns = [{"answer": "4"}, {"answer": "4", "level": 2}]
    for reads_rendered, reads_columns in ((False, False), (True, False), (False, True), (True, True)):
        judge = Recorder(rendered=reads_rendered, columns=reads_columns)
        out = apply_judge(judge, prompts, rendered, [["a", "b"], ["c"]], columns=columns)
        assert out == [[1.0, 1.0], [1.0]]
        assert judge.calls == [
            (rendered if reads_rendered else prompts, {"columns": columns} if reads_columns else {})
        ]
    plain = Recorder(rendered=False, columns=True)
    apply_judge(plain, prompts, rendered, [["a"], ["b"]])  # no columns given: none passed
    assert plain.calls == [(prompts, {})]
    # generate shards from before the rendered prompt was recorded: fine for a judge that does
    # not read it, a clear error (not None as a prompt) for one that does
    old_shards = Recorder(rendered=False, columns=False)
    assert apply_judge(old_shards, prompts, [None, None], [["a"], ["b"]]) == [[1.0], [1.0]]
    with pytest.raises(ValueError, match="delete the candidates' generate/ folder"):
        apply_judge(Recorder(rendered=True, columns=False), prompts, [None, None], [["a"], ["b"]])


def test_apply_judge_hands_reward_functions_their_columns():
    """A real reads_columns judge (TRL-style reward function) reading `answer`: 1.0 on the
    answer, 0.0 otherwise; a PythonJudge (no columns) through the same call is not passed any."""
    from pofe_candidates.judges.reward_funcs import RewardFuncsJudge

    def exact(prompts, completions, answer, **kwargs):
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    out = apply_judge(
        RewardFuncsJudge([("exact", exact)]),
        ["1+1=", "2+2="],
        ["r1", "r2"],
        [["2", "3"], ["5", "4"]],
        columns=[{"answer": "2"}, {"answer": "4"}],
    )
    assert out == [[1.0, 0.0], [0.0, 1.0]]
    out = apply_judge(
        PythonJudge(lambda p, r: float(len(p) + len(r))),
        ["1+1=", "2+2="],
        ["r1", "r2"],
        [["2", "33"], ["4"]],
        columns=[{"answer": "2"}, {"answer": "4"}],
    )
    assert out == [[5.0, 6.0], [5.0]]  # len("1+1=") = 4, + 1 or 2


def test_apply_judge_names_the_dataset_row_of_a_missing_verdict():
    """allow_abstain: false. The judge fails on its call's prompt 1; with rows [7, 12] the
    error names dataset row 12, without rows it keeps the position. A pairwise judge's error
    is re-raised the same way."""

    def fails_on_q(prompt, response):
        return 1 / 0 if prompt == "q" else 1.0

    judge = PythonJudge(fails_on_q, allow_abstain=False, name="fails_on_q")
    with pytest.raises(JudgeError, match=r"no verdict for dataset row 12, candidate 0 \(fails_on_q\): ZeroDivision"):
        apply_judge(judge, ["p", "q"], ["P", "Q"], [["a"], ["b"]], rows=[7, 12])
    with pytest.raises(JudgeError, match=r"no verdict for prompt 1, candidate 0 \(fails_on_q\)"):
        apply_judge(judge, ["p", "q"], ["P", "Q"], [["a"], ["b"]])
    pairwise = PythonPairwiseJudge(lambda p, a, b: math.nan if p == "q" else 1.0, allow_abstain=False, name="pw")
    with pytest.raises(JudgeError, match=r"no verdict for dataset row 7, candidates 0 and 1, pw: non-finite"):
        apply_judge(pairwise, ["q"], ["Q"], [["a", "b"]], rows=[7])


def test_a_result_that_is_not_a_number_names_its_dataset_row():
    """An online window judges prompts 4 and 9 of the dataset, in that order: a python judge, or
    a reward function, returning None on candidate 1 of prompt 9 is named as dataset row 9 (it was "prompt 1",
    its place in the judge call), as a missing verdict is."""
    from pofe_candidates.judges.reward_funcs import RewardFuncsJudge

    judge = PythonJudge(lambda p, r: None if r == "c" else 1.0, name="m:f")
    with pytest.raises(
        TypeError, match=r"^judge m:f returned NoneType None for dataset row 9, candidate 1; expected a number"
    ):
        apply_judge(judge, ["p", "q"], ["P", "Q"], [["a"], ["b", "c"]], rows=[4, 9])
    funcs = RewardFuncsJudge([("word", lambda prompts, completions, **kw: [1.0, 1.0, "good"])])
    with pytest.raises(TypeError, match=r"^reward function word returned str 'good' for dataset row 9, candidate 1;"):
        apply_judge(funcs, ["p", "q"], ["P", "Q"], [["a"], ["b", "c"]], rows=[4, 9])


def test_apply_judge_checks_lengths_and_skips_empty_calls():
    judge = Recorder(rendered=False, columns=True)
    assert apply_judge(judge, [], [], []) == [] and judge.calls == []
    with pytest.raises(ValueError, match="2 prompts but 1 rendered prompts"):
        apply_judge(judge, ["p", "q"], ["P"], [["a"], ["b"]])
    with pytest.raises(ValueError, match="2 prompts but 1 column dicts"):
        apply_judge(judge, ["p", "q"], ["P", "Q"], [["a"], ["b"]], columns=[{}])


@pytest.mark.parametrize("value", ["0.7", True, None, b"1"])
def test_python_judges_refuse_a_result_that_is_not_a_number(value):
    # "0.7" would have become 0.7 and True 1.0 through float(): a judge's bug, named, not a verdict
    j = PythonJudge(lambda p, r: 1.0 if r == "a" else value, name="m:f")
    with pytest.raises(
        TypeError, match=rf"judge m:f returned {type(value).__name__} .* for prompt 1, candidate 0; expected a number"
    ):
        j.score(["p", "q"], [["a"], ["b"]])
    pw = PythonPairwiseJudge(lambda p, a, b: value, name="m:pw")
    with pytest.raises(
        TypeError, match=rf"judge m:pw returned {type(value).__name__} .* for prompt 'q', responses 'x' and 'y'"
    ):
        pw.preferences(["q"], [["x", "y"]])


def test_python_judge_abstains_on_a_score_beyond_float32():
    # 1e300 is finite in float64 but inf in float32, where training reads it; 3e38 is still a float32
    j = PythonJudge(lambda p, r: {"big": 1e300, "neg": -1e300, "ok": 3e38}[r], name="m:f")
    out = j.score(["p"], [["big", "neg", "ok"]])
    assert isinstance(out[0][0], Abstain) and "beyond float32" in out[0][0].reason
    assert isinstance(out[0][1], Abstain) and out[0][2] == 3e38
    assert j.stats.reasons == {"overflow": 2}
    with pytest.raises(JudgeError, match=r"prompt 0, candidate 0 \(m:f\): overflow: score 1e\+300"):
        PythonJudge(lambda p, r: 1e300, allow_abstain=False, name="m:f").score(["p"], [["a"]])


def test_pairwise_order_sums_far_from_one_are_counted_with_the_worst_pair():
    """P(a beats b) = 0.75 whichever is shown first: every pair sums to 1.5, 0.5 off 1 (beyond the
    0.25 tolerance); averaging the orders hid it. 0.6 both ways sums to 1.2: within tolerance,
    counted neither. A consistent judge (P(a,b) = 1 - P(b,a)) sums to 1 exactly."""
    from pofe_candidates.build import _worst_order_sum, order_sum_warning

    (v,) = PythonPairwiseJudge(lambda p, a, b: 0.75).preferences(["q"], [["x", "y", "z"]])
    assert (v.orders_off, v.worst_order_sum) == (3, 1.5)
    assert torch.allclose(v.matrix, torch.full((3, 3), 0.5, dtype=torch.float64))
    (v,) = PythonPairwiseJudge(lambda p, a, b: 0.6).preferences(["q"], [["x", "y"]])
    assert (v.orders_off, v.worst_order_sum) == (0, pytest.approx(1.2))
    (v,) = PythonPairwiseJudge(lambda p, a, b: 1.0 if a < b else 0.0).preferences(["q"], [["x", "y"]])
    assert (v.orders_off, v.worst_order_sum) == (0, 1.0)
    judged = [{"index": 4, "worst_order_sum": 1.2}, {"index": 9, "worst_order_sum": 0.1}, {"index": 5}]
    summary = {"judge_pairs_order_sum_off": 2, "judge_worst_order_sum": _worst_order_sum(judged)}
    assert summary["judge_worst_order_sum"] == {"sum": 0.1, "row": 9}
    assert "2 pairs judged by python_pairwise have" in order_sum_warning(summary, "python_pairwise", "s.json")
    assert "(worst 0.1, prompt row 9)" in order_sum_warning(summary, "python_pairwise", "s.json")


def _sleeps_forever(prompt, response):
    if response == "hang":
        time.sleep(3600)
    if response == "boom":
        raise ValueError("boom")
    return float(len(response))


def test_judge_timeout_stops_a_python_judge_that_never_returns():
    """A thread cannot be killed, so a hung judge function hung the stage for good. With
    judge.timeout the call runs in a worker process that is stopped, and the error names the judge,
    the dataset row and the key; the worker's own results and exceptions come back as before."""
    from pofe_candidates.judges import apply_judge
    from pofe_candidates.judges.timed import JudgeTimeout

    cfg = JudgeConfig(type="python", function=f"{__name__}:_sleeps_forever", timeout=0.5)
    judge = make_judge(cfg)
    (scores,) = judge.score(["q"], [["ab", "boom"]])
    assert scores[0] == 2.0 and isinstance(scores[1], Abstain) and scores[1].reason == "ValueError: boom"
    start = time.monotonic()
    with pytest.raises(
        JudgeTimeout,
        match=rf"judge timed out on dataset row 7, candidate 1 "
        rf"\({__name__}:_sleeps_forever\): python judge {__name__}:_sleeps_forever did not return "
        r"within judge.timeout=0.5 s",
    ):
        apply_judge(judge, ["p", "q"], [None, None], [["a"], ["ab", "hang"]], rows=[3, 7])
    assert time.monotonic() - start < 30
    # a new worker after the stopped one
    assert judge.score(["q"], [["abc"]]) == [[3.0]]
    staged = make_judge(cfg.model_copy(update={"timeout": None, "stage_timeout": 0.5}))
    with pytest.raises(JudgeTimeout, match=r"within judge.stage_timeout=0.5 s"):
        staged.score(["q"], [["hang"]])


def test_judge_timeout_bounds_an_llm_judges_try_in_place_of_request_timeout():
    from pofe_candidates.openai_client import OpenAIClient

    url = "http://127.0.0.1:9/v1"
    assert OpenAIClient.from_config(JudgeConfig(type="llm", base_url=url)).timeout == 120.0
    assert OpenAIClient.from_config(JudgeConfig(type="llm", base_url=url, timeout=3.0)).timeout == 3.0
    # where it would bound nothing it is refused, not ignored
    with pytest.raises(
        ValueError,
        match=r"judge.stage_timeout applies to judge.type: python / python_pairwise, not to judge.type: llm",
    ):
        JudgeConfig(type="llm", base_url=url, stage_timeout=3.0)
    with pytest.raises(ValueError, match=r"judge.timeout applies .* not to judge.type: reward_model"):
        JudgeConfig(type="reward_model", model="m", timeout=3.0)
