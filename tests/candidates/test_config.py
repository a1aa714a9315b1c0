"""Config validation: bounds, cross-field rules, and errors that say what to do."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig


def test_defaults_are_valid():
    g = GenerateConfig()
    assert g.backend == "transformers" and g.sampling().strategy == "sample"
    JudgeConfig(type="python", function="pofe.demo.task:reward")
    CandidatesConfig(out_dir="x")


@pytest.mark.parametrize("backend", ["openai", "vllm"])
def test_beam_on_unsupported_backend_names_supported_ones(backend):
    with pytest.raises(ValidationError, match="backends that support it: transformers"):
        GenerateConfig(backend=backend, strategy="beam", base_url="http://127.0.0.1:1/v1")


def test_diverse_beam_rules():
    with pytest.raises(ValidationError, match="num_beam_groups >= 2"):
        GenerateConfig(strategy="diverse_beam", num_beam_groups=1)
    with pytest.raises(ValidationError, match="multiple of"):
        GenerateConfig(strategy="diverse_beam", num_candidates=5, num_beam_groups=2)
    GenerateConfig(strategy="diverse_beam", num_candidates=4, num_beam_groups=2)


def test_openai_needs_base_url_and_bounds():
    with pytest.raises(ValidationError, match="base_url"):
        GenerateConfig(backend="openai")
    with pytest.raises(ValidationError):
        GenerateConfig(num_candidates=0)
    with pytest.raises(ValidationError):
        GenerateConfig(top_p=0.0)
    with pytest.raises(ValidationError, match=r"unknown key 'temprature' \(did you mean 'temperature'\?\)"):
        GenerateConfig(temprature=0.7)  # typo


def test_api_key_env_must_be_a_name_not_a_key():
    with pytest.raises(ValidationError, match="NAME of an environment variable"):
        GenerateConfig(backend="openai", base_url="http://127.0.0.1:1/v1", api_key_env="sk-abc123")
    g = GenerateConfig(backend="openai", base_url="http://127.0.0.1:1/v1", api_key_env="MY_KEY")
    assert "sk-" not in str(g.public_dict())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"type": "python"}, "module:function"),
        ({"type": "reward_model"}, "judge.model"),
        ({"type": "pairrm"}, "judge.model"),
        ({"type": "llm"}, "base_url"),
        ({"type": "pairwise_llm"}, "base_url"),
        ({"type": "llm", "base_url": "http://x/v1", "score_range": (5, 1)}, "low < high"),
    ],
)
def test_judge_rules(kwargs, match):
    with pytest.raises(ValidationError, match=match):
        JudgeConfig(**kwargs)


def test_pairwise_flag():
    assert JudgeConfig(type="pairwise_llm", base_url="http://x/v1").is_pairwise
    assert not JudgeConfig(type="python", function="a:b").is_pairwise


@pytest.mark.parametrize("greedy", [{"temperature": 0.0}, {"top_k": 1}])
def test_greedy_sampling_with_several_candidates_is_refused(greedy):
    # greedy decoding gives K copies of one text: refused here, not blamed on the judge later
    with pytest.raises(ValidationError, match=f"generate.{next(iter(greedy))}.*greedy.*num_candidates=4"):
        GenerateConfig(num_candidates=4, **greedy)
    GenerateConfig(num_candidates=1, **greedy)  # one candidate (plus dataset responses) is fine
    GenerateConfig(num_candidates=4, strategy="beam", **greedy)  # beams differ by construction
