"""`generate.backend: vllm` online, up to the engine: vLLM runs in the training venv on GPU
installs only (the CPU build pins another torch), so what runs here is the choice of the
colocated sampler, the settings TRL's `VLLMGeneration` gets, and what its output becomes. The
engine itself (`sync_weights`, sleep and wake, sampling) is TRL's and vLLM's, GPU-only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pofe.args import PofeArgs, PofeConfig
from pofe.args.online import GPU_SHARE
from pofe.online.colocated import ColocatedGenerator, ColocatedSampler, completions, engine_settings
from pofe.online.sampling import sampler_for
from pofe_candidates.render import Rendered
from tests.helpers import pofe_block


def _pofe(**generate) -> dict:
    block = pofe_block("rrhf")
    return {"method": "rrhf", **block, "generate": {**block["generate"], "backend": "vllm", **generate}, "online": {}}


def test_a_colocated_engine_follows_the_policy_under_every_setup():
    for adapter in (None, "lora", "qlora"):
        recipe = {"rl": "rrhf", "pofe": _pofe(), "datasets": [{"path": "p.jsonl", "type": "pofe.prompts"}]}
        PofeArgs.model_validate({**recipe, **({"adapter": adapter} if adapter else {})})
    generate = PofeConfig.model_validate(_pofe()).generate
    trainer = SimpleNamespace(processing_class=None)
    assert isinstance(sampler_for(generate, trainer, None, world=8), ColocatedSampler)  # one engine per rank


def test_the_engine_is_told_the_recipes_decoding_and_its_gpu_share():
    generate = PofeConfig.model_validate(
        _pofe(temperature=0.7, top_p=0.9, max_new_tokens=64, vllm_kwargs={"max_model_len": 512})
    ).generate
    assert engine_settings(generate) == {
        "mode": "colocate",
        "enable_sleep_mode": True,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": GPU_SHARE,
        "max_model_length": 512,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "max_completion_length": 64,
    }
    shared = PofeConfig.model_validate(_pofe(vllm_kwargs={"gpu_memory_utilization": 0.5})).generate
    assert engine_settings(shared)["gpu_memory_utilization"] == 0.5


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from pofe.demo.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def test_what_the_engine_sampled_becomes_candidates(tokenizer):
    """Each prompt's n samples in a row; a stop token ends a candidate (kept in its ids, as
    engines return it, the rest dropped), else it ran to max_new_tokens."""
    eos = tokenizer.eos_token_id
    one, two, seven = (tokenizer.convert_tokens_to_ids(c) for c in "127")
    sampled = [[one, two, eos], [seven, seven, seven], [two, eos, one], [eos]]
    out = completions(sampled, 2, tokenizer, [eos])
    assert [[str(c) for c in row] for row in out] == [["12", "777"], ["2", ""]]
    assert [[c.finish_reason for c in row] for row in out] == [["stop", "length"], ["stop", "stop"]]
    assert [[c.token_ids for c in row] for row in out] == [[[one, two, eos], [seven] * 3], [[two, eos], [eos]]]


def test_each_prompt_goes_to_the_engine_n_times_as_token_ids(tokenizer):
    """TRL's colocated `generate` samples one completion per prompt it gets (GRPO repeats each
    prompt num_generations times): the engine here records its call and answers as vLLM would."""

    class Engine:  # stands in for VLLMGeneration, whose engine runs on a GPU only
        def generate(self, prompts, images, num_generations):
            self.call = (prompts, images, num_generations)
            return (
                prompts,
                [[len(p) % 10 + tokenizer.convert_tokens_to_ids("0"), tokenizer.eos_token_id] for p in prompts],
                None,
                None,
            )

    engine = Engine()
    prompts = [Rendered("a", 3, ids=[1, 2, 3]), Rendered("b", 2, ids=[4, 5])]
    out = ColocatedGenerator(engine, tokenizer, [tokenizer.eos_token_id]).generate(prompts, 3, sampling=None)
    assert engine.call == ([[1, 2, 3]] * 3 + [[4, 5]] * 3, None, 3)
    assert [[str(c) for c in row] for row in out] == [["3"] * 3, ["2"] * 3]
