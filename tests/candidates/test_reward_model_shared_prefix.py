"""The reward-model judge runs the tokens a prompt's candidates share once (judges/shared_prefix.py):
the same scores as every candidate's whole text, with fewer tokens through the model."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import BertConfig, DebertaV2Config, LlamaConfig, T5Config

from pofe_candidates.judges import Abstain, PromptCut
from pofe_candidates.judges.reward_model import RewardModelJudge
from pofe_candidates.judges.shared_prefix import reads_causally, shared_length, windows
from tests.helpers import assert_float_close

MAX = 48
# one token per character (the tiny tokenizer): a prompt over MAX is cut, a response over it abstains
PROMPTS = [
    "What is 2+2?",
    "b" * 60 + "?",
    "Say hi.",
    [{"role": "user", "content": "Name a colour."}],
    "Count.",
    "Agree?",
]
RESPONSES = [
    ["4", "4", "4, surely", "four"],  # identical candidates, and one the start of another
    ["yes", "no, that is not it"],  # the prompt is cut from the left, differently per candidate
    ["hi"],  # one candidate: nothing to share
    ["red", "green", "r" * 60],  # the last abstains: too long on its own
    ["1 2 3", "1 2 3 4 5 6", "1 2", "one"],
    ["ok", "ok", "ok, sure"],  # the whole of the first two rows is common: each keeps its pooled token
]


def test_shared_length_is_the_common_prefix_leaving_each_row_its_pooled_token():
    assert shared_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 9]], pad_id=0) == 2
    assert shared_length([[1, 2, 3], [1, 2, 3]], pad_id=0) == 2  # identical rows keep their last token
    assert shared_length([[1, 2, 3, 4], [1, 2, 0, 0]], pad_id=0) == 1  # pooled at the last non-pad, index 1
    assert shared_length([[1, 2, 3]], pad_id=0) == 0  # one row shares with nothing
    assert shared_length([[5, 2], [6, 2]], pad_id=0) == 0


def test_windows_hold_prompts_up_to_the_token_budget():
    assert list(windows([3, 3, 3, 10, 1], 6)) == [[0, 1], [2], [3], [4]]
    assert list(windows([], 6)) == []


def test_only_causal_decoders_share():
    assert reads_causally(LlamaConfig())
    assert not reads_causally(BertConfig())  # maps to a causal LM too, but reads both ways as an encoder
    assert not reads_causally(DebertaV2Config())
    assert not reads_causally(T5Config())


class _TokensIn:
    """Counts the tokens a model reads: each forward's own rows' attention mask (the last
    `input_ids.shape[1]` columns; a prefix's columns were counted when it ran)."""

    def __init__(self, model: torch.nn.Module):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        width = kwargs["input_ids"].shape[1]
        self.count += int(kwargs["attention_mask"][:, -width:].sum())


@pytest.fixture(scope="module")
def eos_pad_reward_model(tiny_reward_model, tmp_path_factory):
    """The tiny reward model padded with its end-of-turn token, as reward models without a pad
    token are: every row ends in a pad id, and the classifier pools the token before it."""
    import json
    import shutil

    path = tmp_path_factory.mktemp("rm-eos-pad") / "rm"
    shutil.copytree(tiny_reward_model, path)
    for name in ("config.json", "tokenizer_config.json"):
        config = json.loads((path / name).read_text())
        config.update({"pad_token_id": 2} if name == "config.json" else {"pad_token": "<|end|>"})
        (path / name).write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("model", ["tiny_reward_model", "eos_pad_reward_model"])
@pytest.mark.parametrize("batch_size", [1, 3, 8])  # windows of batch_size x MAX tokens: 1 to all 6 prompts
def test_shared_scores_equal_whole_scores_with_each_prefix_run_once(model, batch_size, request):
    """Scores with and without sharing agree up to float32 rounding, kinds and order included,
    across batch sizes and window budgets (several windows, batches mixing rows that share
    nothing); the shared run reads each prompt's common prefix once: total - sum (K - 1) x prefix
    tokens, the prefix found by os.path.commonprefix over the whole rows."""
    path = str(request.getfixturevalue(model))
    shared = RewardModelJudge(path, batch_size=batch_size, max_length=MAX)
    whole = RewardModelJudge(path, batch_size=batch_size, max_length=MAX, prefix_sharing=False)
    assert shared.shares_prefix and not whole.shares_prefix
    counted = {name: _TokensIn(judge.model) for name, judge in (("shared", shared), ("whole", whole))}
    got, ref = shared.score(PROMPTS, RESPONSES), whole.score(PROMPTS, RESPONSES)
    assert [[type(s) for s in row] for row in got] == [[type(s) for s in row] for row in ref]
    assert sum(isinstance(s, PromptCut) for row in got for s in row) == 2
    assert sum(isinstance(s, Abstain) for row in got for s in row) == 1
    pairs = [(float(a), float(b)) for ga, gb in zip(got, ref) for a, b in zip(ga, gb) if not isinstance(b, Abstain)]
    assert len(pairs) == 16
    # float32 sums over the width 64 and at most MAX tokens, as in test_reward_model_cut
    assert_float_close(torch.tensor([a for a, _ in pairs]), torch.tensor([b for _, b in pairs]), n_terms=64 * MAX)

    encoded = whole.encode_all([(p, r) for p, rs in zip(PROMPTS, RESPONSES) for r in rs])
    rows, start = [], 0
    for rs in RESPONSES:
        rows.append([encoded[n].inputs["input_ids"] for n in range(start, start + len(rs)) if encoded[n].inputs])
        start += len(rs)
    total = sum(len(r) for group in rows for r in group)
    pooled_from_end = 2 if model == "eos_pad_reward_model" else 1  # the pooled token: the last non-pad
    assert {r[-1] == whole.model.config.pad_token_id for group in rows for r in group} == {pooled_from_end == 2}
    saved = sum(
        (len(group) - 1) * min(len(os.path.commonprefix(group)), min(len(r) for r in group) - pooled_from_end)
        for group in rows
        if len(group) > 1
    )
    assert counted["whole"].count == total
    assert counted["shared"].count == total - saved and saved > 3 * 10  # the template alone is 10+ tokens a row


def test_a_model_reading_sentence_pairs_scores_whole_texts(pair_reward_model):
    """prefix_sharing is on by default, but a model without a chat template (the pair format of
    DeBERTa-style reward models) has no shared prefix to run once."""
    assert not RewardModelJudge(str(pair_reward_model)).shares_prefix
