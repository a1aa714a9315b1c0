"""Transformers backend on a tiny random local Llama: each strategy, shapes, seeds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pofe.preprocess.config import GenerateConfig
from pofe.preprocess.generators.diverse_beam import HammingDiversityProcessor
from pofe.preprocess.generators.hf import TransformersGenerator, load_tokenizer
from pofe.preprocess.render import render_prompt


@pytest.fixture(scope="module")
def gen(tiny_policy):
    return TransformersGenerator(str(tiny_policy), batch_size=2)


@pytest.fixture(scope="module")
def prompts(tiny_policy):
    tok = load_tokenizer(str(tiny_policy))
    raw = ["What is 1+2?", [{"role": "user", "content": "Say hi"}], "2+2="]
    return [render_prompt(tok, p).text for p in raw]


def test_rendering_uses_the_chat_template(prompts):
    assert prompts[0] == "<|user|>What is 1+2?<|end|><|assistant|>"


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
        prompts[:2], 4, GenerateConfig(strategy="diverse_beam", num_candidates=4, num_beam_groups=2, max_new_tokens=8).sampling()
    )
    plain = gen.generate(prompts[:2], 2, GenerateConfig(strategy="beam", num_candidates=2, max_new_tokens=8).sampling())
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
    cut = render_prompt(tok, long, max_prompt_tokens=10, overflow="truncate")
    assert cut.truncated and cut.text.endswith("<|assistant|>")
    assert len(tok(cut.text, add_special_tokens=False)["input_ids"]) == 10
