"""Nash-MD's refresh without a model: the recipe's rules, each policy sample judged against its
opponent by every kind of judge (`pofe.online.opponents`), the rows and stats it makes."""

from __future__ import annotations

import math
from functools import partial

import pytest
from pydantic import ValidationError

from pofe.args import PofeConfig
from pofe.columns import PI_0_LOGPS
from pofe.data.tokenize import tokenize_row
from pofe.methods import method_spec
from pofe.online.opponents import OPPONENTS, opponent_stats, play_window, preference_rows
from pofe.online.refresh import LOGP, TOKENS, RefreshContext, Window, with_scores
from pofe.online.stats import window_stats
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generators.interface import Completion
from pofe_candidates.judges import make_judge

NASH_MD = method_spec("nash_md")
GENERATE = {"backend": "transformers", "num_candidates": 4, "temperature": 1.0, "max_new_tokens": 4}
JUDGE = {"type": "python", "function": "pofe.demo.task:reward", "preferences": "hard"}
# two prompts (dataset rows 3 and 5), four samples of the policy and four opponents each
PROMPTS = {3: {"prompt": "1+2="}, 5: {"prompt": "10+10="}}
SAMPLES = [["3", "4", "", "x"], ["20", "19", "20", "2"]]
OPPONENTS_SAMPLED = [["4", "3", "3", "3"], ["x", "20", "25", "20"]]


def _nash_md(**changes) -> dict:
    block = {"method": "nash_md", "generate": GENERATE, "judge": JUDGE, "online": {"refresh_every": 1}}
    return {**block, **changes}


def test_the_recipe_rules_of_a_method_that_plays_the_mixture():
    pofe = PofeConfig.model_validate(_nash_md(online={"kl_coef": 0.05}, nash_md={"mixture_coef": 0.25}))
    assert (pofe.kl_coef, pofe.nash_md.mixture_coef) == (0.05, 0.25)
    assert PofeConfig.model_validate(_nash_md()).nash_md is None  # mixture_coef 0.125 when unset
    refusals = {
        "add a pofe.online block": _nash_md(online=None),
        "set strategy: sample": _nash_md(generate={**GENERATE, "strategy": "beam"}),
        "trains on the policy's own samples only": _nash_md(generate={**GENERATE, "include_dataset_responses": ["a"]}),
        "dropping duplicates would bias": _nash_md(generate={**GENERATE, "dedupe": True}),
        r"mixture_coef\n  Value error, mixture_coef: 1.5 is out of range; set a finite number >= 0.0 and <= 1.0": _nash_md(
            nash_md={"mixture_coef": 1.5}
        ),
    }
    for message, block in refusals.items():
        with pytest.raises(ValidationError, match=message):
            PofeConfig.model_validate(block)
    rrhf = {**_nash_md(nash_md={"mixture_coef": 0.25}), "method": "rrhf", "judge": {**JUDGE, "preferences": None}}
    with pytest.raises(ValidationError, match="applies to `rl: nash_md` only"):
        PofeConfig.model_validate(rrhf)


class Scripted:
    """A generator whose samples are given: prompt p's are `texts[p]` (ids: the text's characters
    and the end of turn, as the tiny tokenizer reads them)."""

    name = "scripted"

    def __init__(self, texts: list[list[str]], tokenizer):
        self.texts, self.tokenizer = texts, tokenizer

    def generate(self, prompts, n, sampling):
        ids = lambda text: [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]  # noqa: E731
        return [[Completion(t, "stop", ids(t)) for t in self.texts[p][:n]] for p in range(len(prompts))]


def _play(tokenizer, judge: dict, samples=SAMPLES, opponents=OPPONENTS_SAMPLED):
    judge_cfg = JudgeConfig.model_validate(judge)
    return play_window(
        Window(0, [[3, 5]]),
        PROMPTS,
        RefreshContext(
            generator=Scripted(samples, tokenizer),
            judge=make_judge(judge_cfg),
            tokenizer=tokenizer,
            method=NASH_MD,
            generate=GenerateConfig.model_validate(GENERATE),
            judge_cfg=judge_cfg,
            candidates=CandidatesConfig().for_method("nash_md"),
            timer=lambda name: _Nothing(),
        ),
        Scripted(opponents, tokenizer),
    )


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_verifier_gives_each_sample_a_sharp_preference_over_its_opponent(tokenizer):
    """The toy's verifier under `preferences: hard`: 1 + 2 = 3 beats 4 (rewards 1 and 0.25), the
    empty answer is judged (reward 0, it loses to 3) and not dropped; 19 loses to 20, 20 beats 25."""
    generated, judged = _play(tokenizer, JUDGE)
    assert [g["index"] for g in generated] == [3, 5]
    first, second = judged
    assert first["responses"] == SAMPLES[0] and first[OPPONENTS] == OPPONENTS_SAMPLED[0]
    assert first["preferences"] == [1.0, 0.0, 0.0, 0.0]
    assert second["preferences"] == [1.0, 0.0, 1.0, 0.0]
    assert first["rewards"] == [1.0, 0.25, 0.0, 0.0] and first["opponent_rewards"] == [0.25, 1.0, 1.0, 1.0]
    assert first["response_ids"][2] == [] and first["judged"] == 8 and first["abstained"] == 0


def test_samples_and_opponents_that_write_a_user_turn_are_cut_and_counted(tokenizer):
    """The policy's second sample of prompt 3 answers "4" and then writes a user turn of its own
    ("<|user|>5+5="), and two opponents of prompt 5 answer "20" and do the same ("<|user|>?"): each is
    cut before "<|user|>" on its ids, judged as "4" and "20" (so the preferences are the plain
    answers', as in the first test), trained on the ids of its answer, and counted: 1 sample in
    window_stats, 2 opponents in opponent_stats."""
    samples = [["3", "4<|user|>5+5=", "", "x"], SAMPLES[1]]
    opponents = [OPPONENTS_SAMPLED[0], ["x", "20<|user|>?", "25", "20<|user|>?"]]
    generated, judged = _play(tokenizer, JUDGE, samples, opponents)
    first, second = judged
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert first["responses"] == SAMPLES[0] and first["response_ids"][1] == ids("4")
    assert second[OPPONENTS] == OPPONENTS_SAMPLED[1] and second["opponent_ids"][1] == ids("20")
    assert first["preferences"] == [1.0, 0.0, 0.0, 0.0] and second["preferences"] == [1.0, 0.0, 1.0, 0.0]
    assert window_stats(generated, judged, kept={}, kl=[])["candidates_cut_at_user_turn"] == 1.0
    assert opponent_stats(judged, {}, NASH_MD, mixture_kl=None)["opponents_cut_at_user_turn"] == 2.0


def test_a_reward_model_gives_sigmoid_of_the_reward_difference(tokenizer):
    """`preferences: bradley_terry` (a reward model's): P = sigmoid(r - r') pair by pair, e.g.
    sigmoid(1 - 0.25) for 3 over 4, sigmoid(0.5/2 - 1) for 19 over 20."""
    _, (first, second) = _play(tokenizer, {**JUDGE, "preferences": "bradley_terry"})
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert first["preferences"] == pytest.approx([sigmoid(0.75), sigmoid(-0.75), sigmoid(-1.0), sigmoid(-1.0)])
    assert second["preferences"][1] == pytest.approx(sigmoid(0.25 - 1.0))


def longer_wins(prompt, a: str, b: str) -> float:
    """P(a beats b) 0.9 for the longer text, 0.1 for the shorter, 1/2 for equal lengths; shown
    second, a text gains 0.05 (a position bias both orders cancel). 'x' has no verdict."""
    if "x" in (a, b):
        raise ValueError("no verdict on x")
    return 0.5 + 0.4 * ((len(a) > len(b)) - (len(a) < len(b))) - 0.05


def test_a_pairwise_judge_in_both_orders_and_its_abstentions(tokenizer):
    """A pairwise function judged in both orders: (f(a, b) + 1 - f(b, a)) / 2 cancels the 0.05 position
    bias, so 3 and 4 tie at 1/2 and the empty answer loses to 3 at 0.1; a pair with x abstains in
    both orders and is left out (counted); 19 and 20 tie, 2 loses to 20 at 0.1. The stats: the kept
    samples' mean preference, no rewards; the empty answer is trained as its end of turn."""
    judge = {"type": "python_pairwise", "function": "tests.online.test_online_nash_md:longer_wins"}
    _, judged = _play(tokenizer, judge)
    first, second = judged
    assert first["responses"] == ["3", "4", ""] and first["preferences"] == pytest.approx([0.5, 0.5, 0.1])
    assert second["responses"] == ["19", "20", "2"] and second["preferences"] == pytest.approx([0.5, 0.5, 0.1])
    assert second[OPPONENTS] == ["20", "25", "20"] and second["rewards"] is None
    assert (first["abstained"], second["abstained"]) == (1, 1)
    tokenize = partial(tokenize_row, tokenizer=tokenizer, sequence_len=64, max_prompt_len=32, truncation="truncate")
    kept = preference_rows(judged, NASH_MD, tokenize)
    assert sorted(kept) == [3, 5]
    assert kept[3][TOKENS]["response_ids"][2] == [tokenizer.eos_token_id]  # the empty answer: its end of turn
    assert opponent_stats(judged, kept, NASH_MD, mixture_kl=0.25) == {
        "pairs": 6.0,
        "pairs_tied": 4.0,  # the 0.5s: no push either way
        "opponents_cut_at_user_turn": 0.0,
        "preference": pytest.approx((0.5 + 0.5 + 0.1) * 2 / 6),
        "mixture_kl": 0.25,
    }


def test_with_scores_reads_pi_0s_log_probs_for_the_loss_and_leaves_the_label():
    row = {
        "prompt_index": 3,
        "preferences": [1.0, 0.0],
        TOKENS: {"prompt_ids": [1], "response_ids": [[2], [3]]},
        LOGP: [-1.0, -2.0],
        PI_0_LOGPS: [-1.5, -2.5],
    }
    assert with_scores(row, NASH_MD, kl_coef=0.1) == {
        "prompt_ids": [1],
        "response_ids": [[2], [3]],
        "preferences": [1.0, 0.0],
        "pi_0_logps": [-1.5, -2.5],
    }
