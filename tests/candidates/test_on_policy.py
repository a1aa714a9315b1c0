"""On-policy round 1: with `lora_model_dir`, candidates come from base + adapter, the policy
SPPO's anchor is computed from."""

from __future__ import annotations

import pytest
import torch
from axolotl.utils.dict import DictDefault

from pofe.columns import IGNORE_INDEX
from pofe.data.candidates import sampling_policy
from pofe.scoring import response_logps
from pofe_candidates.config import GenerateConfig
from pofe_candidates.generators import make_generator
from pofe_candidates.models import load_tokenizer
from tests.helpers import approx_float


@pytest.fixture(scope="module")
def adapter(tiny_policy, tmp_path_factory):
    """A saved LoRA adapter on the tiny policy that changes its outputs (B not zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    path = tmp_path_factory.mktemp("adapter") / "lora"
    get_peft_model(base, lora).save_pretrained(path)
    return path


def _cfg(tiny_policy, adapter=None):
    return DictDefault(base_model=str(tiny_policy), lora_model_dir=str(adapter) if adapter else None)


def _logps(model, prompt_ids, response_ids):
    ids = torch.tensor([prompt_ids + response_ids])
    labels = torch.tensor([[IGNORE_INDEX] * len(prompt_ids) + response_ids])
    with torch.no_grad():
        return response_logps(model, ids, torch.ones_like(ids), labels)[0].item()


def test_policy_path_is_the_adapter_when_one_is_loaded(tiny_policy, adapter):
    gen = GenerateConfig()
    assert sampling_policy(_cfg(tiny_policy), gen) == str(tiny_policy)
    assert sampling_policy(_cfg(tiny_policy, adapter), gen) == str(adapter)
    # an explicit generate.model still wins
    assert sampling_policy(_cfg(tiny_policy, adapter), GenerateConfig(model="other")) == "other"


def test_openai_backend_with_an_adapter_is_refused_naming_the_fix(tiny_policy, adapter):
    with pytest.raises(ValueError, match=r"--enable-lora --lora-modules policy=.*generate.model: policy"):
        sampling_policy(_cfg(tiny_policy, adapter), GenerateConfig(backend="openai", base_url="http://h:1/v1"))


def test_sampling_policy_scores_as_the_anchor(tiny_policy, adapter):
    """The transformers backend's model gives a candidate the log-prob the trainer's policy
    (axolotl: PeftModel.from_pretrained(base, lora_model_dir)) gives it; the base alone does not."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    gen_cfg = GenerateConfig(num_candidates=1, max_new_tokens=6, temperature=1.0, seed=0)
    generator = make_generator(gen_cfg, sampling_policy(_cfg(tiny_policy, adapter), gen_cfg))
    tok = load_tokenizer(str(adapter))
    prompt = tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tok("two", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    base = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    anchor = PeftModel.from_pretrained(base, adapter).eval()
    sampled = _logps(generator.model, prompt_ids, response_ids)
    anchored = _logps(anchor, prompt_ids, response_ids)
    # float32 sums over the MLP's width x the sequence's tokens, in the log-prob's size
    width = anchor.config.intermediate_size
    assert sampled == approx_float(anchored, width * (len(prompt_ids) + len(response_ids)), abs(anchored))
    with anchor.disable_adapter():
        assert abs(sampled - _logps(anchor, prompt_ids, response_ids)) > 1e-3
