"""Transformers backend on a tiny random local Llama: each strategy, shapes, seeds."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch

from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generators import Completion
from pofe_candidates.generators.diverse_beam import HammingDiversityProcessor
from pofe_candidates.generators.hf import TransformersGenerator, _to_samples, sample_responses, stop_token_ids
from pofe_candidates.models import load_tokenizer
from pofe_candidates.pipeline import run_pipeline
from pofe_candidates.render import render_prompt
from pofe_candidates.shard_work import generate_shard


@pytest.fixture(scope="module")
def gen(tiny_policy):
    return TransformersGenerator(str(tiny_policy), batch_size=2)


@pytest.fixture(scope="module")
def prompts(tiny_policy):
    tok = load_tokenizer(str(tiny_policy))
    raw = ["What is 1+2?", [{"role": "user", "content": "Say hi"}], "2+2="]
    return [render_prompt(tok, p) for p in raw]


def test_rendering_uses_the_chat_template(prompts):
    assert prompts[0].text == "<|user|>What is 1+2?<|end|><|assistant|>"


@pytest.mark.parametrize(
    "cfg",
    [
        GenerateConfig(strategy="sample", num_candidates=4, max_new_tokens=8, temperature=1.0, seed=3),
        GenerateConfig(strategy="beam", num_candidates=4, max_new_tokens=8),
        GenerateConfig(strategy="diverse_beam", num_candidates=4, num_beam_groups=2, max_new_tokens=8),
    ],
    ids=lambda c: c.strategy,
)
def test_each_strategy_shapes_and_reproducible(gen, prompts, cfg):
    prompts = prompts[:2]  # one batch of 2 (left padding exercised): beams are slow on CPU
    a = gen.generate(prompts, cfg.num_candidates, cfg.sampling())
    b = gen.generate(prompts, cfg.num_candidates, cfg.sampling())
    assert len(a) == len(prompts) and all(len(c) == cfg.num_candidates for c in a)
    assert all(isinstance(s, str) for c in a for s in c)
    assert a == b  # same seed -> same candidates


def test_different_seed_different_samples(gen, prompts):
    s = GenerateConfig(num_candidates=4, max_new_tokens=8, temperature=1.0, seed=0).sampling()
    a = gen.generate(prompts, 4, s)
    b = gen.generate(prompts, 4, dataclasses.replace(s, seed=1))
    assert a != b


def test_beam_candidates_are_distinct_sequences(gen, prompts):
    out = gen.generate(prompts[:1], 4, GenerateConfig(strategy="beam", num_candidates=4, max_new_tokens=8).sampling())
    assert len(set(out[0])) == 4


def test_diverse_beam_group_zero_is_plain_beam(gen, prompts):
    """Group 0 runs unpenalised: its beams equal plain beam search with num_candidates/G beams."""
    div = gen.generate(
        prompts[:2],
        4,
        GenerateConfig(strategy="diverse_beam", num_candidates=4, num_beam_groups=2, max_new_tokens=8).sampling(),
    )
    plain = gen.generate(
        prompts[:2], 2, GenerateConfig(strategy="beam", num_candidates=2, max_new_tokens=8).sampling()
    )
    assert [d[:2] for d in div] == plain


def test_hamming_processor_by_hand():
    """previous (B=1, M=2, T=2): position 0 tokens {3, 3}, position 1 tokens {1, -1 (pad)}.
    At t=0 token 3 is penalised 2 * 0.5 = 1.0; at t=1 token 1 by 0.5; padding never counts."""
    prev = torch.tensor([[[3, 1], [3, -1]]])
    proc = HammingDiversityProcessor(prev, prompt_len=2, num_beams=2, penalty=0.5)
    scores = torch.zeros(2, 5)
    s0 = proc(torch.zeros(2, 2, dtype=torch.long), scores)
    assert torch.equal(s0, torch.tensor([[0, 0, 0, -1.0, 0]] * 2))
    s1 = proc(torch.zeros(2, 3, dtype=torch.long), scores)
    assert torch.equal(s1, torch.tensor([[0, -0.5, 0, 0, 0]] * 2))
    s2 = proc(torch.zeros(2, 4, dtype=torch.long), scores)  # beyond the previous outputs
    assert torch.equal(s2, scores)


def test_prompt_overflow_drop_and_truncate(tiny_policy):
    tok = load_tokenizer(str(tiny_policy))
    long = "x" * 50
    dropped = render_prompt(tok, long, max_prompt_tokens=10, overflow="drop")
    assert dropped.text is None and "max_prompt_tokens=10" in dropped.reason
    # one turn too long: dropped, not cut mid-text without its role token (bad case 3 of issue 20)
    one_turn = render_prompt(tok, long, max_prompt_tokens=10, overflow="truncate")
    assert one_turn.text is None and "its last user turn alone does not fit" in one_turn.reason
    # <|system|>s<|end|> 3 + <|user|>x*50<|end|> 52 + <|user|>xy<|end|> 4 + <|assistant|> 1: the oldest
    # user turn goes, the system message stays, and the turns kept are what the rows carry
    turns = [{"role": "system", "content": "s"}, {"role": "user", "content": long}, {"role": "user", "content": "xy"}]
    cut = render_prompt(tok, turns, max_prompt_tokens=10, overflow="truncate")
    assert cut.text == "<|system|>s<|end|><|user|>xy<|end|><|assistant|>"
    assert (cut.truncated, cut.num_tokens, cut.messages, cut.ids) == (
        True,
        8,
        [turns[0], turns[2]],
        tok(cut.text)["input_ids"],
    )


def test_generation_config_stop_tokens_end_responses(tiny_policy, prompts):
    """Every token listed in generation_config.eos_token_id (chat models list several): each
    response is one stop token, finish_reason "stop". With only the tokenizer's eos (the old
    behaviour) the random model's responses run on towards max_new_tokens."""
    g = TransformersGenerator(str(tiny_policy), batch_size=2)
    g.model.generation_config.eos_token_id = list(range(len(g.tokenizer)))
    sampling = GenerateConfig(num_candidates=3, max_new_tokens=8, temperature=1.0).sampling()
    samples = sample_responses(g.model, g.tokenizer, [p.text for p in prompts[:2]], 3, sampling, batch_size=2)
    assert [[len(s.response_ids) for s in row] for row in samples] == [[1, 1, 1], [1, 1, 1]]
    out = g.generate(prompts[:2], 3, sampling)
    assert [[c.finish_reason for c in row] for row in out] == [["stop"] * 3] * 2


def test_stop_token_ids_union_of_generation_config_and_tokenizer(gen):
    tok = gen.tokenizer
    model = types.SimpleNamespace(generation_config=types.SimpleNamespace(eos_token_id=[9, 10]))
    assert stop_token_ids(model, tok) == [9, 10, tok.eos_token_id]
    model.generation_config.eos_token_id = tok.eos_token_id
    assert stop_token_ids(model, tok) == [tok.eos_token_id]


def test_finish_reason_stop_or_length_by_hand(gen):
    """_to_samples: a response holding a stop token ends there ("stop"); one without is cut at
    max_new_tokens ("length"), its trailing padding removed."""
    tok = gen.tokenizer
    a, b, pad = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b"), tok.pad_token_id
    enc = {"input_ids": torch.tensor([[a]]), "attention_mask": torch.tensor([[1]])}
    rows = _to_samples(tok, enc, [[a, b, b, pad], [a, b, b, b], [a, a, a, a]], 3, stops=[b])
    assert [(s.response_ids, s.text, s.finish_reason) for s in rows[0]] == [
        ([a, b], "a", "stop"),
        ([a, b], "a", "stop"),
        ([a, a, a, a], "aaaa", "length"),
    ]


class _Cut:
    """Fake backend: candidate j of each prompt is "c{j}", the last one cut at max_new_tokens."""

    name = "fake"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, n, sampling):
        self.prompts += prompts
        return [[Completion(f"c{j}", "length" if j == n - 1 else "stop") for j in range(n)] for _ in prompts]


@pytest.mark.parametrize("truncated", ["drop", "keep"])
def test_truncated_candidates_dropped_and_counted_or_kept(tiny_policy, truncated):
    tok = load_tokenizer(str(tiny_policy))
    cfg = GenerateConfig(num_candidates=3, dedupe=False)
    [row] = generate_shard([{"prompt": "hi"}], 0, _Cut(), tok, cfg, cfg.sampling(), truncated=truncated)
    if truncated == "drop":
        assert (row["candidates"], row["finish_reasons"], row["truncated_dropped"]) == (["c0", "c1"], ["stop"] * 2, 1)
    else:
        assert (row["candidates"], row["finish_reasons"], row["truncated_dropped"]) == (
            ["c0", "c1", "c2"],
            ["stop", "stop", "length"],
            0,
        )


@pytest.mark.parametrize(("truncated", "dropped", "kept"), [(None, 0, 3), ("drop", 2, 2)])
def test_pipeline_counts_truncated_candidates(tiny_policy, tmp_path, truncated, dropped, kept):
    """Two prompts x one cut candidate each: kept by default (the method's), or dropped and
    counted in summary.json."""
    result = run_pipeline(
        [{"prompt": "a"}, {"prompt": "b"}],
        method="rrhf",
        policy_path=str(tiny_policy),
        generate=GenerateConfig(num_candidates=3),
        judge=JudgeConfig(type="python", function="pofe.demo.task:reward"),
        candidates=CandidatesConfig(out_dir=str(tmp_path), progress=False, truncated=truncated),
        generator=_Cut(),
    )
    assert result.summary["truncated_candidates_dropped"] == dropped
    assert [len(json.loads(x)["responses"]) for x in result.data_path.read_text().splitlines()] == [kept, kept]


def _recipe(policy, generate: dict):
    from axolotl.utils.dict import DictDefault

    return DictDefault(
        base_model=str(policy),
        tokenizer_config=str(policy),
        chat_template="chatml",
        dataset_prepared_path=None,
        pofe={
            "method": "rrhf",
            "generate": {"num_candidates": 2, **generate},
            "judge": {"type": "python", "function": "pofe.demo.task:reward"},
        },
    )


def _build(cfg, **kw):
    from axolotl.utils.dict import DictDefault

    from pofe.args import pofe_config
    from pofe.data.candidates import build_candidates

    entry = DictDefault(path="p.jsonl", split="train")
    return build_candidates(cfg, pofe_config(cfg), entry, [{"prompt": "hi"}], "prompt", **kw)


CHATML_HI = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_candidates_render_with_the_training_tokenizer(tiny_policy, monkeypatch):
    """build_candidates renders prompts with axolotl's load_tokenizer(cfg): the recipe's
    chat_template (chatml here), not the policy folder's own template."""
    import pofe_candidates.pipeline as pipeline

    seen = {}
    monkeypatch.setattr(pipeline, "run_pipeline", lambda rows, **kw: seen.update(kw))
    _build(_recipe(tiny_policy, {}), stop_after="generate")
    assert render_prompt(seen["tokenizer"], "hi").text == CHATML_HI
    assert render_prompt(load_tokenizer(str(tiny_policy)), "hi").text == "<|user|>hi<|end|><|assistant|>"


def test_a_served_model_name_is_never_loaded(tiny_policy, tmp_path):
    """`generate.model: policy` with a base_url is the server's name for its model: the prompts
    are rendered with the recipe's tokenizer and sent, and nothing is loaded from "policy" (it
    was: transformers went to the hub for a model named "policy" and no request was sent)."""
    from axolotl.loaders import load_tokenizer as axolotl_tokenizer

    from tests.openai_server import FakeServer, completions_ok

    with FakeServer(completions_ok) as server:
        generate = {"backend": "openai", "model": "policy", "base_url": server.url}
        cfg = _recipe(tiny_policy, generate)
        cfg.pofe["candidates"] = {"out_dir": str(tmp_path), "progress": False}
        _build(cfg, stop_after="generate")
    expected = render_prompt(axolotl_tokenizer(cfg), "hi")
    assert expected.text == CHATML_HI
    assert [(body["model"], body["prompt"]) for _, body in server.requests] == [("policy", expected.ids)]


def test_a_served_model_name_without_a_tokenizer_names_the_keys(tmp_path):
    """No tokenizer where tokenizer_config / base_model point: an error naming the served name,
    the path tried and the keys to set, not transformers' hub error for "policy"."""
    from pofe.errors import PofeError

    missing = tmp_path / "absent"
    cfg = _recipe(missing, {"backend": "openai", "model": "policy", "base_url": "http://127.0.0.1:1/v1"})
    with pytest.raises(PofeError) as caught:
        _build(cfg, stop_after="generate")
    message = str(caught.value)
    assert "generate.model: 'policy' is the server's name for its model" in message
    assert f"did not load from {str(missing)!r}" in message
    assert "Set tokenizer_config (or base_model)" in message


def test_sample_responses_reports_each_batch_as_it_ends(gen, prompts):
    """3 prompts in batches of 2: `progress` hears 2, then 1 (evaluation's bars move so), and
    the samples are those of a call without it (the batch seeds are the same)."""
    sampling = GenerateConfig(num_candidates=2, max_new_tokens=4, temperature=1.0).sampling()
    heard: list[int] = []
    texts = [p.text for p in prompts]
    with_bar = sample_responses(gen.model, gen.tokenizer, texts, 2, sampling, batch_size=2, progress=heard.append)
    assert heard == [2, 1]
    plain = sample_responses(gen.model, gen.tokenizer, texts, 2, sampling, batch_size=2)
    assert [[s.response_ids for s in row] for row in with_bar] == [[s.response_ids for s in row] for row in plain]
