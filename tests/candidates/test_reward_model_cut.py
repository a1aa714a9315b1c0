"""The reward-model judge keeps each response whole: a prompt too long for judge.max_length
loses its start (BOS kept), a response too long on its own is an abstention; both counted."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pofe.demo.tiny import CHAT_TEMPLATE
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.judges import Abstain, PromptCut
from pofe_candidates.judges.reward_model import RESPONSE_TOO_LONG, RewardModelJudge, left_cut
from pofe_candidates.pipeline import run_pipeline
from tests.helpers import approx_float, assert_float_close

MAX = 32
# one token per character; `<s>`, `<|user|>`, `<|end|>`, `<|assistant|>` one token each
LONG_PROMPT = "a" * 40 + "the question?"  # 53 characters
SHORT_PROMPT = "2+2="


@pytest.fixture(scope="module")
def bos_reward_model(tiny_reward_model, tmp_path_factory):
    """The tiny reward model with a template that writes BOS first, as Llama 3's and Mistral's do."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("rm-bos") / "rm"
    shutil.copytree(tiny_reward_model, path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = "{{ bos_token }}" + CHAT_TEMPLATE
    tok.save_pretrained(path)
    return path


def _reference_score(path, text: str) -> float:
    """One unpadded forward of `text`, pooling the last token by hand."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    assert ids.shape[1] <= MAX
    with torch.no_grad():
        return model.score(model.model(input_ids=ids).last_hidden_state[:, -1]).item()


def test_left_cut_keeps_the_first_token_and_the_response():
    ids = list(range(10))  # prompt 0..5, response 6..9
    assert left_cut(ids, 6, 10, 1) == ids
    assert left_cut(ids, 6, 7, 1) == [0, 4, 5, 6, 7, 8, 9]  # prompt tokens 1..3 go
    assert left_cut(ids, 6, 5, 1) == [0, 6, 7, 8, 9]  # no prompt token left but BOS
    assert left_cut(ids, 6, 4, 1) is None  # BOS + the 4 response tokens need 5
    assert left_cut(ids, 6, 4, 0) == [6, 7, 8, 9]


def test_long_prompt_is_cut_from_the_left_and_scored_as_the_cut_input(bos_reward_model):
    judge = RewardModelJudge(str(bos_reward_model), batch_size=2, max_length=MAX)
    (scores,) = judge.score([LONG_PROMPT], [["hello", "x" * 40]])
    cut, dropped = scores
    assert isinstance(cut, PromptCut)
    # full input: <s><|user|> + 53 + <|end|><|assistant|> + hello<|end|> = 63 tokens; kept: <s> and
    # the last 31: hello<|end|> (6), <|end|><|assistant|> (2) and the prompt's last 23 characters
    kept = "<s>" + LONG_PROMPT[-23:] + "<|end|><|assistant|>hello<|end|>"
    assert float(cut) == approx_float(_reference_score(bos_reward_model, kept), 64 * MAX)  # width x tokens
    # 40 characters + <|end|> = 41 tokens cannot fit in 32 beside BOS: abstained
    assert isinstance(dropped, Abstain) and dropped.reason.startswith(RESPONSE_TOO_LONG)
    assert "41 tokens" in dropped.reason
    assert judge.stats.abstentions == 1 and judge.stats.calls == 1


def test_short_input_is_scored_whole(bos_reward_model):
    judge = RewardModelJudge(str(bos_reward_model), max_length=MAX)
    ((score,),) = judge.score([SHORT_PROMPT], [["4"]])
    assert type(score) is float
    whole = "<s><|user|>2+2=<|end|><|assistant|>4<|end|>"
    assert score == approx_float(_reference_score(bos_reward_model, whole), 64 * MAX)


class FixedGenerator:
    name = "fixed"

    def generate(self, prompts, n, sampling):
        return [["hello", "hi", "x" * 40][:n] for _ in prompts]


def test_pipeline_counts_cut_and_dropped_candidates(bos_reward_model, tiny_policy, tmp_path, caplog):
    rows = [{"prompt": LONG_PROMPT}, {"prompt": SHORT_PROMPT}, {"prompt": LONG_PROMPT + "!"}]
    with caplog.at_level("WARNING", logger="axolotl.integrations.pofe_candidates.pipeline"):
        res = run_pipeline(
            rows,
            policy_path=str(tiny_policy),
            method="rrhf",
            generate=GenerateConfig(num_candidates=3, max_new_tokens=4, dedupe=False),
            judge=JudgeConfig(type="reward_model", model=str(bos_reward_model), max_length=MAX),
            candidates=CandidatesConfig(out_dir=str(tmp_path), shard_size=2, progress=False),
            generator=FixedGenerator(),
        )
    s = json.loads(res.summary_path.read_text())
    # the two long prompts: "hello" and "hi" cut (4 candidates); the short prompt: none cut.
    # "x" * 40 is too long alone in all three rows: 3 abstentions
    assert s["judge_prompts_cut"] == 4 and s["judge_rows_with_prompt_cut"] == 2
    assert s["judge_abstentions"] == 3 and s["judge_abstention_reasons"] == {RESPONSE_TOO_LONG: 3}
    assert "4 candidates of 2 prompts were judged with their prompt cut" in caplog.text


@pytest.mark.parametrize("model", ["bos_reward_model", "pair_reward_model"])
def test_batched_encoding_and_sorted_batches_match_one_pair_at_a_time(model, request):
    """`encode_all` (one tokenizer call) gives `encode`'s inputs for every pair, cut or not;
    `score` in length-sorted batches of 3 gives each candidate its score alone (batch of 1), in
    order, up to float32 rounding, and the same kinds (PromptCut, Abstain, float)."""
    path = str(request.getfixturevalue(model))
    prompts = [LONG_PROMPT, SHORT_PROMPT, "what is 7+8?"]
    responses = [["hello", "x" * 40, "hi"], ["4", "four, i think", "5"], ["15", "fifteen"]]
    judge = RewardModelJudge(path, batch_size=3, max_length=MAX)
    flat = [(p, r) for p, rs in zip(prompts, responses) for r in rs]
    encoded = judge.encode_all(flat)
    assert encoded == [judge.encode(p, r) for p, r in flat]
    assert sum(e.prompt_cut > 0 for e in encoded) == 2 and sum(e.inputs is None for e in encoded) == 1
    assert len({len(e.inputs["input_ids"]) for e in encoded if e.inputs}) > 3  # sorting reorders them
    batched = [s for row in judge.score(prompts, responses) for s in row]
    alone = [s for row in RewardModelJudge(path, batch_size=1, max_length=MAX).score(prompts, responses) for s in row]
    assert [type(s) for s in batched] == [type(s) for s in alone]
    values = [(float(b), float(a)) for b, a in zip(batched, alone) if not isinstance(a, Abstain)]
    # float32 sums over the width 64 and at most MAX tokens
    assert_float_close(torch.tensor([b for b, _ in values]), torch.tensor([a for _, a in values]), n_terms=64 * MAX)


def test_sentence_pair_input_cuts_the_prompt_from_the_left(pair_reward_model):
    """No chat template: the pair's first text (the prompt) is cut from its left by the tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = pair_reward_model
    judge = RewardModelJudge(str(path), max_length=MAX)
    assert not judge.tokenizer.chat_template
    ((cut, dropped),) = judge.score([LONG_PROMPT], [["hello", "x" * 40]])
    # this tokenizer adds no special tokens to a pair: 27 prompt characters + "hello" = 32
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    ids = torch.tensor([tok(LONG_PROMPT[-27:], "hello")["input_ids"]])
    assert ids.shape[1] == MAX
    with torch.no_grad():
        ref = model.score(model.model(input_ids=ids).last_hidden_state[:, -1]).item()
    assert isinstance(cut, PromptCut) and float(cut) == approx_float(ref, 64 * MAX)
    assert isinstance(dropped, Abstain) and dropped.reason.startswith(RESPONSE_TOO_LONG)
