"""Which generator samples a refresh (`pofe.online.sampling`), without a real server: the recipe
rules of the served path, the adapter loads and unloads a refresh sends (to a scripted stand-in
of vLLM's routes), and the server's end with the training's."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from pofe.args import PofeArgs, PofeConfig
from pofe.online.sampling import ADAPTER, ModelSampler, ServedSampler, ServedSamplingError, sampler_for
from pofe.online.trainer import OnlineTraining
from pofe_candidates.config import GenerateConfig
from tests.helpers import pofe_block
from tests.openai_server import FakeServer, completions_ok, openai_client

SERVE = {
    "command": "/venv/bin/python -m vllm.entrypoints.openai.api_server --model {model} --port {port} {lora_modules}"
}


def _recipe(generate: dict, **top) -> dict:
    pofe = {"method": "rrhf", **pofe_block("rrhf"), "online": {}}
    pofe["generate"] = {**pofe["generate"], **generate}
    return {"rl": "rrhf", "pofe": pofe, "datasets": [{"path": "p.jsonl", "type": "pofe.prompts"}], **top}


def test_a_served_policy_is_a_lora_adapter_loaded_at_each_refresh():
    for generate in ({"backend": "openai", "serve": SERVE}, {"backend": "openai", "base_url": "http://h:8000/v1"}):
        for adapter in ("lora", "qlora"):
            PofeArgs.model_validate(_recipe(generate, adapter=adapter))
    with pytest.raises(
        ValidationError,
        match=r"trains every weight \(adapter: unset\), whose sync needs NCCL between the trainer and the server "
        r"\(TRL's vllm-serve\), on GPUs only, which POFE does not do. Set adapter: lora or qlora, or "
        r"generate.backend: transformers",
    ):
        PofeArgs.model_validate(_recipe({"backend": "openai", "serve": SERVE}))
    PofeArgs.model_validate(_recipe({}))  # the training model samples: full fine-tuning is fine
    unloadable = {"backend": "openai", "serve": {"command": "srv --model {model} --port {port}"}}
    with pytest.raises(ValidationError, match=r"add \{lora_modules\} to generate.serve.command"):
        PofeConfig.model_validate(_recipe(unloadable)["pofe"])


class _Policy:
    """Stands in for the unwrapped PeftModel: `save_pretrained` writes an adapter of rank 8 on
    /base, its weights the refresh's number."""

    def __init__(self):
        self.saved: list[Path] = []

    def save_pretrained(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/base", "r": 8}))
        self.saved.append(Path(path))


def _lora_routes(path, body, attempt):
    """vLLM's answers: plain text for the LoRA routes, JSON for completions."""
    if path.endswith("_lora_adapter"):
        return 200, f"Success: LoRA adapter '{body['lora_name']}' done.", 0.0
    return completions_ok(path, body, attempt)


def test_each_refresh_loads_its_adapter_unloads_the_previous_and_samples_with_it(tmp_path):
    with FakeServer(_lora_routes) as server:
        generate = GenerateConfig(backend="openai", base_url=server.url, in_flight=2, num_candidates=2)
        sampler, policy = ServedSampler(generate, tmp_path), _Policy()
        names = []
        for step in (0, 3):
            folder = tmp_path / f"refresh-{step:07d}"
            generator = sampler.generator(policy, folder)
            names.append(generator.model)
            assert generator.client.base_url == server.url
        sampler.close()
    first, second = (str((tmp_path / f"refresh-{s:07d}" / ADAPTER).resolve()) for s in (0, 3))
    assert names == ["pofe-online-refresh-0000000", "pofe-online-refresh-0000003"]
    assert policy.saved == [tmp_path / "refresh-0000000" / ADAPTER, tmp_path / "refresh-0000003" / ADAPTER]
    assert server.requests == [
        ("/v1/load_lora_adapter", {"lora_name": names[0], "lora_path": first}),
        ("/v1/load_lora_adapter", {"lora_name": names[1], "lora_path": second}),
        ("/v1/unload_lora_adapter", {"lora_name": names[0]}),
    ]


def test_an_adapter_an_earlier_run_left_loaded_is_replaced(tmp_path):
    """A killed run's last refresh is still loaded on a server at base_url: vLLM refuses the name
    (HTTP 400, its message below); it is unloaded and loaded again, from this run's folder."""
    loaded = {"pofe-online-refresh-0000000"}

    def routes(path, body, attempt):
        name = body.get("lora_name")
        if path.endswith("/load_lora_adapter") and name in loaded:
            message = f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place"
            return 400, json.dumps({"error": {"message": message, "code": 400}}), 0.0
        (loaded.discard if path.endswith("/unload_lora_adapter") else loaded.add)(name)
        return 200, "Success", 0.0

    with FakeServer(routes) as server:
        generate = GenerateConfig(backend="openai", base_url=server.url, in_flight=2)
        ServedSampler(generate, tmp_path).generator(_Policy(), tmp_path / "refresh-0000000")
    load = {"lora_name": "pofe-online-refresh-0000000", "lora_path": str(tmp_path / "refresh-0000000" / ADAPTER)}
    assert server.requests == [
        ("/v1/load_lora_adapter", load),
        ("/v1/unload_lora_adapter", {"lora_name": "pofe-online-refresh-0000000"}),
        ("/v1/load_lora_adapter", load),
    ]
    assert loaded == {"pofe-online-refresh-0000000"}


def test_a_server_without_the_runtime_lora_routes_is_named_with_the_fix(tmp_path):
    # vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING has no such route: 404
    with FakeServer(lambda path, body, attempt: (404, '{"detail": "Not Found"}', 0.0)) as server:
        generate = GenerateConfig(backend="openai", base_url=server.url, in_flight=2)
        with pytest.raises(
            ServedSamplingError,
            match=r"loading the policy's adapter .*refresh-0000000/adapter into the server at http://127.0.0.1:\d+/v1 "
            r"failed: POST .*/load_lora_adapter failed after 1 try: HTTP 404.*start vLLM with "
            r"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment and --enable-lora --max-lora-rank",
        ):
            ServedSampler(generate, tmp_path).generator(_Policy(), tmp_path / "refresh-0000000")


def test_post_text_returns_a_plain_answer_and_retries_a_server_error():
    answers = iter([(503, "busy", 0.0), (200, "Success: LoRA adapter 'a' added successfully.", 0.0)])
    with FakeServer(lambda path, body, attempt: next(answers)) as server:
        client = openai_client(server.url)
        assert (
            client.post_text("load_lora_adapter", {"lora_name": "a"})
            == "Success: LoRA adapter 'a' added successfully."
        )
    assert (client.stats.requests, client.stats.retries) == (2, 1)


def test_the_sampler_of_each_backend():
    transformers = GenerateConfig()
    served = GenerateConfig(backend="openai", base_url="http://h:8000/v1")
    assert isinstance(
        sampler_for(transformers, SimpleNamespace(processing_class=None), Path("/o"), world=2), ModelSampler
    )
    assert isinstance(sampler_for(served, SimpleNamespace(processing_class=None), Path("/o"), world=1), ServedSampler)
    with pytest.raises(ServedSamplingError, match="runs in one training process for now; this run has 2"):
        sampler_for(served, SimpleNamespace(processing_class=None), Path("/o"), world=2)


def test_the_sampler_is_closed_when_training_fails():
    class Failing:
        def train(self, *args, **kwargs):
            raise RuntimeError("step 2 failed")

    class Sampler:
        closed = False

        def close(self):
            Sampler.closed = True

    trainer_cls = type("T", (OnlineTraining, Failing), {})
    trainer = trainer_cls.__new__(trainer_cls)
    trainer.__dict__["_sampler"] = Sampler()  # the cached property, as the first refresh leaves it
    with pytest.raises(RuntimeError, match="step 2 failed"):
        trainer.train()
    assert Sampler.closed
