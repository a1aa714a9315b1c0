"""Nash-MD's opponent sampler (`pofe.online.mixture`) on the tiny model with a random LoRA adapter:
at mixture weight 0 it samples what the adapted policy samples, at 1 what pi_0 (the adapter
disabled) samples, from left-padded batches of prompts of different lengths, several samples per
prompt; and the mixture's logged distance from the policy is the KL of a plain forward of both."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pofe.online.mixture import MixtureGenerator
from pofe.online.models import Pi0Policy
from pofe_candidates.config import Sampling
from pofe_candidates.generators.hf import sample_responses
from pofe_candidates.models import load_tokenizer
from pofe_candidates.render import render_prompt
from tests.helpers import load_llama

PROMPTS = ["1+1=", "12+19=", "7+3=", "20+20=", "0+5="]
SAMPLING = Sampling(temperature=1.0, max_new_tokens=6, seed=11)
N = 3  # samples per prompt


@pytest.fixture(scope="module")
def adapted(tiny_model):
    """The tiny model with a LoRA adapter whose B is random (not zero), so policy != pi_0."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    model = get_peft_model(load_llama(tiny_model), lora).eval()
    tokenizer = load_tokenizer(str(tiny_model))
    prompts = [render_prompt(tokenizer, p) for p in PROMPTS]
    return model, tokenizer, prompts


def _mixture(model, tokenizer, beta: float) -> MixtureGenerator:
    base = Pi0Policy(SimpleNamespace(adapter="lora"), accelerator=None)
    return MixtureGenerator(model, lambda: base.forward(model), tokenizer, mixture_coef=beta, batch_size=2)


def _ids(completions) -> list[list[list[int]]]:
    return [[c.token_ids for c in row] for row in completions]


def _plain(model, tokenizer, prompts) -> list[list[list[int]]]:
    samples = sample_responses(model, tokenizer, [list(p.ids) for p in prompts], N, SAMPLING, batch_size=2)
    return [[s.response_ids for s in row] for row in samples]


def test_mixture_weight_0_samples_the_policy_and_1_samples_pi_0(adapted):
    model, tokenizer, prompts = adapted
    policy = _plain(model, tokenizer, prompts)
    with model.disable_adapter():
        base = _plain(model, tokenizer, prompts)
    assert policy != base  # the adapter changes what is sampled
    assert _ids(_mixture(model, tokenizer, 0.0).generate(prompts, N, SAMPLING)) == policy
    assert _ids(_mixture(model, tokenizer, 1.0).generate(prompts, N, SAMPLING)) == base


def test_the_mixture_distance_is_the_per_token_kl_from_the_policy(adapted):
    """At weight 1 the mixture is pi_0: the logged mean per-token KL(pi_mix || pi_theta) equals
    the mean over every sampled token (the stop token included, nothing after it) of
    KL(pi_0 || pi_theta) at that position, from one plain forward of each model over the prompt
    and the sampled response (float32, vocabulary sums of ~100 terms: 1e-4 relative); at weight
    0 it is 0."""
    model, tokenizer, prompts = adapted
    generator = _mixture(model, tokenizer, 1.0)
    completions = generator.generate(prompts, N, SAMPLING)
    kls = []
    for prompt, row in zip(prompts, completions):
        for c in row:
            # a response cut at max_new_tokens comes back without trailing pad tokens it sampled
            # (`_to_samples` cannot tell them from padding): it drew max_new_tokens tokens
            tail = SAMPLING.max_new_tokens - len(c.token_ids) if c.finish_reason == "length" else 0
            ids = torch.tensor([list(prompt.ids) + c.token_ids + [tokenizer.pad_token_id] * tail])
            positions = slice(len(prompt.ids) - 1, ids.shape[1] - 1)  # where each sampled token was drawn
            with torch.no_grad():
                policy = model(input_ids=ids).logits[0, positions].log_softmax(-1)
                with model.disable_adapter():
                    base = model(input_ids=ids).logits[0, positions].log_softmax(-1)
            kls.extend((base.exp() * (base - policy)).sum(-1).tolist())
    assert generator.distance.tokens == len(kls)
    assert generator.distance.mean == pytest.approx(sum(kls) / len(kls), rel=1e-4)
    assert generator.distance.mean > 0.01
    at_zero = _mixture(model, tokenizer, 0.0)
    at_zero.generate(prompts, N, SAMPLING)
    assert at_zero.distance.mean == pytest.approx(0.0, abs=1e-6)
