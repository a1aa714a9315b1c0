"""TRL-style batched reward functions (`judge.reward_funcs`, `reward_weights`): the call TRL
makes, weighted sums, None as abstention, and errors that name the function."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pydantic import ValidationError

from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.judges import Abstain, JudgeError, make_judge
from pofe_candidates.judges.reward_funcs import RewardFuncsJudge
from pofe_candidates.pipeline import run_pipeline

CALLS: list[dict] = []  # what the pipeline passed to the functions below


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[0]["content"]


def exact_answer(prompts, completions, answer, **kwargs):
    """GRPO-style: 1 for the dataset's answer, 0 otherwise; None (no verdict) without an answer."""
    CALLS.append(dict(fn="exact_answer", prompts=prompts, completions=completions, answer=answer, **kwargs))
    return [None if a is None else float(_text(c).strip() == a) for c, a in zip(completions, answer)]


def length_tenths(prompts, completions, **kwargs):
    """Plain batched function: a tenth of the completion's length in characters."""
    CALLS.append(dict(fn="length_tenths", n=len(completions)))
    return [len(_text(c)) / 10 for c in completions]


def no_kwargs(prompts, completions):
    return [0.0] * len(completions)


def one_short(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def _judge(*fns, weights=None, allow_abstain=True):
    return RewardFuncsJudge([(f.__name__, f) for f in fns], weights, allow_abstain=allow_abstain)


ROWS = [
    {"prompt": "2+2=", "answer": "4", "human": ["4", "five"], "source": "a"},
    {"prompt": [{"role": "user", "content": "1+2="}], "answer": "3", "human": ["3"], "source": "b"},
    {"prompt": "1+1=", "answer": None, "human": ["2"], "source": "c"},
]


def test_pipeline_weighted_sum_of_the_functions_own_values(tiny_policy, tmp_path):
    """Real pipeline (transformers backend, tiny random policy), judge.reward_funcs loaded from
    dotted paths, weights [2, 0.5]. The dataset's responses are candidates too, so some rewards
    are known by hand: row 0 "4" = 2 x 1 + 0.5 x 0.1 = 2.05, "five" = 2 x 0 + 0.5 x 0.4 = 0.2;
    row 1 "3" (conversational) = 2.05; row 2 has no answer, so exact_answer abstains and "2" =
    0.5 x 0.1 = 0.05. Every reward equals 2 x exact_answer + 0.5 x length_tenths called on the
    row by hand, and each function ran once per shard with TRL's arguments."""
    CALLS.clear()
    judge = JudgeConfig(
        type="python",
        reward_funcs=[f"{__name__}.exact_answer", f"{__name__}.length_tenths"],
        reward_weights=[2.0, 0.5],
    )
    res = run_pipeline(
        ROWS,
        policy_path=str(tiny_policy),
        method="rrhf",
        judge=judge,
        generate=GenerateConfig(num_candidates=2, max_new_tokens=4, include_dataset_responses=["human"]),
        candidates=CandidatesConfig(out_dir=str(tmp_path), shard_size=2, progress=False, truncated="keep"),
    )
    rows = [json.loads(line) for line in res.data_path.read_text().splitlines()]
    by_text = [dict(zip(r["responses"], r["rewards"])) for r in rows]
    assert by_text[0]["4"] == pytest.approx(2.05) and by_text[0]["five"] == pytest.approx(0.2)
    assert by_text[1]["3"] == pytest.approx(2.05) and by_text[2]["2"] == pytest.approx(0.05)
    for src, r in zip(ROWS, rows):
        n = len(r["responses"])
        kw = dict(prompts=[src["prompt"]] * n, answer=[src["answer"]] * n)
        comps = [
            [{"role": "assistant", "content": t}] if isinstance(src["prompt"], list) else t for t in r["responses"]
        ]
        exact, length = exact_answer(completions=comps, **kw), length_tenths(completions=comps, **kw)
        want = [0.5 * b if a is None else 2 * a + 0.5 * b for a, b in zip(exact, length)]
        assert r["rewards"] == pytest.approx(want, abs=1e-12)
    calls = [c for c in CALLS[:4] if c["fn"] == "exact_answer"]  # the pipeline's calls: 2 shards x 2 functions
    assert [c["fn"] for c in CALLS[:4]] == ["exact_answer", "length_tenths"] * 2
    first = calls[0]  # shard 0: rows 0 and 1, grouped by prompt; every other column as a list
    assert set(first) == {"fn", "prompts", "completions", "answer", "human", "source"}
    k0 = first["prompts"].count("2+2=")
    assert first["prompts"][k0:] == [ROWS[1]["prompt"]] * (len(first["prompts"]) - k0)
    assert first["answer"] == ["4"] * k0 + ["3"] * (len(first["prompts"]) - k0)
    assert first["source"][0] == "a" and first["human"][-1] == ["3"]
    assert isinstance(first["completions"][0], str)
    assert first["completions"][-1][0]["role"] == "assistant"  # conversational prompt -> message list
    assert calls[1]["answer"] == [None] * len(calls[1]["prompts"])  # shard 1: row 2 alone


def test_none_inf_and_exceptions_become_abstentions():
    """c0: 1 x 1 + 3 x 2 = 7; c1: f gives None, g gives 5 -> 3 x 5 = 15 (TRL's nansum); c2: both
    None -> abstains; c3: inf -> abstains. A raising function abstains every candidate."""
    f = lambda prompts, completions, **kw: [1.0, None, None, float("inf")]  # noqa: E731
    g = lambda prompts, completions, **kw: [2, 5, float("nan"), 0.0]  # noqa: E731
    j = RewardFuncsJudge([("f", f), ("g", g)], [1.0, 3.0])
    out = j.score(["p", "q"], [["a", "b"], ["c", "d"]])
    assert out[0] == [7.0, 15.0]
    assert out[1][0] == Abstain("every reward function returned None")
    assert isinstance(out[1][1], Abstain) and "non-finite" in out[1][1].reason
    assert j.stats.calls == 4 and j.stats.abstentions == 2

    def boom(prompts, completions, **kw):
        raise KeyError("answer")

    j = RewardFuncsJudge([("g", g), ("mod.boom", boom)])
    out = j.score(["p"], [["a", "b", "c", "d"]])
    assert all(isinstance(v, Abstain) and "mod.boom raised KeyError" in v.reason for v in out[0])
    with pytest.raises(JudgeError, match=r"prompt 0, candidate 0 \(g, mod.boom\): mod.boom raised KeyError"):
        RewardFuncsJudge([("g", g), ("mod.boom", boom)], allow_abstain=False).score(["p"], [["a", "b", "c", "d"]])


def hangs_on_hang(prompts, completions, **kwargs):
    """Never returns when a completion is "hang"; raises on "boom"; else the length."""
    if "hang" in completions:
        time.sleep(3600)
    if "boom" in completions:
        raise ValueError("boom")
    return [float(len(c)) for c in completions]


def test_judge_timeout_stops_a_reward_function_that_never_returns():
    """judge.timeout and stage_timeout bound reward_funcs as they bound judge.function: the call
    runs in a worker process that is stopped, the error names the function and the key, and the
    worker's results and exceptions come back as before."""
    from pofe_candidates.judges.timed import JudgeTimeout

    cfg = JudgeConfig(type="python", reward_funcs=[f"{__name__}.hangs_on_hang"], timeout=0.5)
    judge = make_judge(cfg)
    assert judge.score(["q"], [["ab", "abc"]]) == [[2.0, 3.0]]
    (scores,) = judge.score(["q"], [["boom"]])
    assert isinstance(scores[0], Abstain) and scores[0].reason == f"{__name__}.hangs_on_hang raised ValueError: boom"
    start = time.monotonic()
    with pytest.raises(JudgeTimeout, match=rf"{__name__}.hangs_on_hang did not return within judge.timeout=0.5 s"):
        judge.score(["q"], [["a", "hang"]])
    assert time.monotonic() - start < 30
    assert judge.score(["q"], [["abcd"]]) == [[4.0]]  # a new worker after the stopped one
    staged = make_judge(cfg.model_copy(update={"timeout": None, "stage_timeout": 0.5}))
    with pytest.raises(JudgeTimeout, match=r"within judge.stage_timeout=0.5 s"):
        staged.score(["q"], [["hang"]])


def test_columns_are_repeated_per_candidate_and_async_functions_awaited():
    seen = {}

    async def rate(prompts, completions, level, **kwargs):
        await asyncio.sleep(0)
        seen.update(prompts=prompts, level=level, extra=kwargs)
        return [lv * len(c) for lv, c in zip(level, completions)]

    out = _judge(rate).score(["p", "q"], [["ab", "c"], ["def"]], columns=[{"level": 1}, {"level": 10, "tag": "x"}])
    assert out == [[2.0, 1.0], [30.0]]
    assert seen == dict(prompts=["p", "p", "q"], level=[1, 1, 10], extra={"tag": [None, None, "x"]})


def test_bad_functions_and_results_are_errors_naming_the_function():
    with pytest.raises(TypeError, match=r"no_kwargs\(prompts, completions\) must take \*\*kwargs"):
        _judge(no_kwargs)
    with pytest.raises(TypeError, match="cannot be called as fn\\(prompts=..., completions=..., \\*\\*kwargs\\)"):
        _judge(lambda texts: [])
    with pytest.raises(ValueError, match="one_short returned 1 rewards for 2 completions"):
        _judge(one_short).score(["p"], [["a", "b"]])
    with pytest.raises(TypeError, match="returned str 'good' for prompt 1, candidate 0; expected a number or None"):
        RewardFuncsJudge([("word", lambda prompts, completions, **kw: [1.0, "good"])]).score(
            ["p", "q"], [["a"], ["b"]]
        )
    with pytest.raises(TypeError, match="returned float; expected a list of 1 rewards"):
        RewardFuncsJudge([("scalar", lambda prompts, completions, **kw: 1.0)]).score(["p"], [["a"]])
    with pytest.raises(ValueError, match=r"dataset column\(s\) \['prompts'\].*rename"):
        _judge(length_tenths).score(["p"], [["a"]], columns=[{"prompts": 1}])


def test_make_judge_loads_dotted_paths_and_names_what_is_missing():
    judge = make_judge(JudgeConfig(type="python", reward_funcs=[f"{__name__}.length_tenths"]))
    assert judge.score(["p"], [["abcd"]]) == [[pytest.approx(0.4)]] and judge.weights == [1.0]
    with pytest.raises(ImportError, match="judge.reward_funcs 'no_such_mod.fn': cannot import module 'no_such_mod'"):
        make_judge(JudgeConfig(type="python", reward_funcs=["no_such_mod.fn"]))
    with pytest.raises(AttributeError, match=f"module '{__name__}' has no attribute 'nope'"):
        make_judge(JudgeConfig(type="python", reward_funcs=[f"{__name__}.nope"]))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(reward_funcs=["m.f", "m.g"], reward_weights=[1.0]), "1 weights for 2 reward_funcs"),
        (dict(reward_funcs=["m.f"], reward_weights=[float("inf")]), r"reward_weights: \[inf\] is out of range"),
        (dict(reward_funcs=["m.f"], function="m:f"), "function and judge.reward_funcs are both set"),
        (dict(reward_funcs=["m:f"]), "not dotted paths"),
        (dict(reward_funcs=["f"]), "not dotted paths"),
        (dict(reward_funcs=[]), "at least 1 item"),
        (dict(function="m:f", reward_weights=[1.0]), "reward_weights weighs judge.reward_funcs, which is not set"),
        (dict(type="python_pairwise", function="m:f", reward_funcs=["m.f"]), "applies to judge.type: python"),
        (dict(), "needs judge.function: 'module:function' .* or judge.reward_funcs"),
    ],
)
def test_config_rules(kwargs, error):
    with pytest.raises(ValidationError, match=error):
        JudgeConfig(**{"type": "python", **kwargs})


def test_config_round_trips():
    cfg = JudgeConfig(type="python", reward_funcs=["m.f", "m.g"], reward_weights=[1.0, -0.5])
    assert JudgeConfig(**cfg.model_dump()) == cfg


def test_an_argument_no_column_fills_is_an_error_naming_the_columns():
    with pytest.raises(
        TypeError,
        match=r"exact_answer\(prompts, completions, answer, \*\*kwargs\) cannot take "
        r"this call \(missing a required argument: 'answer'\).* here are \['level'\]",
    ):
        _judge(exact_answer).score(["p"], [["a"]], columns=[{"level": 1}])


def test_a_bool_reward_is_an_error_and_a_sum_beyond_float32_abstains():
    with pytest.raises(
        TypeError,
        match=r"reward function flag returned bool True for prompt 0, candidate 1; expected a number or None",
    ):
        RewardFuncsJudge([("flag", lambda prompts, completions, **kw: [1.0, True])]).score(["p"], [["a", "b"]])
    # each term is a float32, their sum (3e38 + 3e38 = 6e38) is not: training would read inf
    judge = RewardFuncsJudge(
        [("a", lambda prompts, completions, **kw: [3e38, 1.0]), ("b", lambda prompts, completions, **kw: [3e38, 2.0])]
    )
    out = judge.score(["p"], [["x", "y"]])
    assert out[0][1] == 3.0 and "beyond float32" in out[0][0].reason
    assert judge.stats.reasons == {"overflow": 1}
