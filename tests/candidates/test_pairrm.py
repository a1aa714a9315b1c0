"""PairRM: llm-blender's published layout and numbers, and how its logits become preferences.

The parity tests rebuild the tiny seeded checkpoint of make_pairrm_reference.py (layout of
llm-blender/PairRM: a RankerConfig config.json, pytorch_model.bin, a backbone with an NFKC
spm.model only)
and compare POFE against fixtures/pairrm/reference.json, which llm-blender 0.0.2's own code
computed (.ci/pairrm-reference.sh). The remaining tests use a DeBERTa-v2 config.json carrying
the ranker fields (the llm-blender/PairRM-hf layout) and a word-level tokenizer.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from pofe_candidates.config import JudgeConfig
from pofe_candidates.judges import make_judge
from pofe_candidates.judges.pairrm import (
    CAND1_PREFIX,
    CAND2_PREFIX,
    SOURCE_PREFIX,
    PairRMJudge,
    PairRMModel,
    PairRMSettings,
    encode_pair,
    ensure_prefix_tokens,
    preferences_from_logits,
)
from pofe_candidates.judges.pairrm_inputs import encode_prompts
from tests.candidates import make_pairrm_reference as reference
from tests.helpers import assert_float_close, float_tolerance

# float32 sums behind one pair's logit on the tiny PairRM: the width 32 x the longest pair (<= 48 tokens)
PAIR_TERMS = 32 * 48

REFERENCE = json.loads((reference.FIXTURES / "reference.json").read_text())


# ---- preferences_from_logits: numbers worked by hand ------------------------------------


def test_preferences_authors_by_hand():
    """C = [[., 2, 1], [0.5, ., 1], [-0.5, -0.5, .]] (diagonal ignored, here 7):
    C - C.T off the diagonal: (0,1) 2 - 0.5 = 1.5, (0,2) 1 + 0.5 = 1.5, (1,2) 1 + 0.5 = 1.5, so
    s = mean_j (C_ij - C_ji) over K = 3 (the j = i term is 0) = [3/3, (-1.5 + 1.5)/3, -3/3] = [1, 0, -1],
    P_ij = sigmoid(s_i - s_j): P01 = P12 = sigmoid(1) = 0.7310586, P02 = sigmoid(2) = 0.8807971."""
    c = torch.tensor([[7.0, 2.0, 1.0], [0.5, 7.0, 1.0], [-0.5, -0.5, 7.0]])
    p = preferences_from_logits(c, mode="authors")
    expected = torch.tensor(
        [[0.5, 0.7310586, 0.8807971], [0.2689414, 0.5, 0.7310586], [0.1192029, 0.2689414, 0.5]], dtype=torch.float64
    )
    assert torch.allclose(p, expected, atol=1e-7)
    assert preferences_from_logits(c).equal(p)  # authors is the default


def test_preferences_both_orders_by_hand():
    """Same C. P_ij = (sigmoid(C_ij) + 1 - sigmoid(C_ji)) / 2:
    P01 = (sigmoid(2) + 1 - sigmoid(0.5)) / 2 = (0.8807971 + 1 - 0.6224593) / 2 = 0.6291689,
    P02 = (sigmoid(1) + 1 - sigmoid(-0.5)) / 2 = (0.7310586 + 1 - 0.3775407) / 2 = 0.6767590,
    P12 = (sigmoid(1) + 1 - sigmoid(-0.5)) / 2 = 0.6767590."""
    c = torch.tensor([[7.0, 2.0, 1.0], [0.5, 7.0, 1.0], [-0.5, -0.5, 7.0]])
    p = preferences_from_logits(c, mode="both_orders")
    expected = torch.tensor(
        [[0.5, 0.6291689, 0.6767590], [0.3708311, 0.5, 0.6767590], [0.3232410, 0.3232410, 0.5]], dtype=torch.float64
    )
    assert torch.allclose(p, expected, atol=1e-7)


def test_authors_is_sharper_than_both_orders():
    """K = 2, an antisymmetric judge C01 = ln 3 = -C10: s = [(0 + 2 ln 3) / 2, -ln 3], so the
    authors' P01 = sigmoid(2 ln 3) = 9 / 10, while both orders give sigmoid(ln 3) = 3 / 4."""
    d = math.log(3.0)
    c = torch.tensor([[0.0, d], [-d, 0.0]], dtype=torch.float64)
    assert preferences_from_logits(c, "authors")[0, 1].item() == pytest.approx(0.9, abs=1e-12)
    assert preferences_from_logits(c, "both_orders")[0, 1].item() == pytest.approx(0.75, abs=1e-12)


def test_preferences_bad_input():
    with pytest.raises(ValueError, match=r"square \(K, K\) matrix, got shape \(2, 3\)"):
        preferences_from_logits(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="unknown PairRM preference mode 'mean'"):
        preferences_from_logits(torch.zeros(2, 2), mode="mean")


# ---- parity with llm-blender 0.0.2 on the published layout -------------------------------


@pytest.fixture(scope="module")
def published_dir(tmp_path_factory) -> Path:
    return reference.build_checkpoint(tmp_path_factory.mktemp("published"))


def test_published_layout_rebuilt_exactly(published_dir):
    """The checkpoint the reference was computed on: same weights, llm-blender's file layout."""
    state = torch.load(published_dir / "pytorch_model.bin", weights_only=True)
    assert reference.weights_digest(state) == REFERENCE["weights_sha256"]
    assert reference.spm_digest(published_dir) == REFERENCE["spm_sha256"]  # else rerun .ci/pairrm-reference.sh
    assert sorted(p.name for p in published_dir.iterdir()) == ["config.json", "pytorch_model.bin"]
    raw = json.loads((published_dir / "config.json").read_text())
    assert raw["ranker_type"] == "pairranker" and raw["model_type"] == "deberta"
    backbone = Path(raw["model_name"])
    files = ["config.json", "model.safetensors", "spm.model", "tokenizer_config.json"]  # as microsoft/deberta-v3-large
    assert sorted(p.name for p in backbone.iterdir()) == files
    # embeddings as llm-blender saves them: resized to len(tokenizer), not the backbone's vocab_size
    assert state["pretrained_model.embeddings.word_embeddings.weight"].shape[0] == REFERENCE["embedding_rows"] == 69
    assert json.loads((backbone / "config.json").read_text())["vocab_size"] == 80


@pytest.mark.parametrize("lengths", ["checkpoint_lengths", "overridden_lengths"])
def test_matches_llm_blender(published_dir, lengths):
    """Loaded by path through judge.model: llm-blender's token ids for every ordered pair, its
    `_full_predict` logits (1e-4) and `rank` scores; preferences are compute_prob.py's
    sigmoid(s_i - s_j) of those scores. The second pass caps judge.max_length at 32, which
    splits 16 : 8 : 8 as `rank(source_max_length=16, candidate_max_length=8)` did."""
    extra = {} if lengths == "checkpoint_lengths" else {"max_length": 32}
    judge = make_judge(JudgeConfig(type="pairrm", model=str(published_dir), batch_size=4, **extra))
    m, tok = judge.model, judge.tokenizer
    assert len(tok) == REFERENCE["len_tokenizer"]
    assert m.pretrained_model.get_input_embeddings().weight.shape[0] == REFERENCE["embedding_rows"]
    names = {
        "source": SOURCE_PREFIX,
        "candidate1": CAND1_PREFIX,
        "candidate2": CAND2_PREFIX,
        "candidate": "<|candidate|>",
    }
    assert {names[k]: v for k, v in REFERENCE["prefix_ids"].items()} == m.prefix_ids
    for case in REFERENCE["cases"]:
        ref, cands = case[lengths], case["candidates"]
        for pair, ids in ref["input_ids"].items():
            i, j = map(int, pair.split(","))
            assert encode_pair(tok, m.settings, m.prefix_ids, case["source"], cands[i], cands[j]) == ids, pair
        (c,) = judge.logit_matrices([case["source"]], [cands])
        assert torch.allclose(c, torch.tensor(ref["logits"]), atol=1e-4)
        scores = (c - c.T).mean(dim=1)
        assert torch.allclose(scores, torch.tensor(ref["rank_scores"]), atol=1e-4)
        s = torch.tensor(ref["rank_scores"], dtype=torch.float64)
        (verdict,) = judge.preferences([case["source"]], [cands])
        assert torch.allclose(verdict.matrix, torch.sigmoid(s[:, None] - s[None, :]), atol=1e-4)


def test_batched_encoding_equals_one_pair_at_a_time(published_dir):
    """encode_prompts tokenises each candidate once per prompt (one call per candidate budget):
    its ids are encode_pair's for every ordered pair, on llm-blender's spm tokenizer, with
    sources of different lengths (so different candidate budgets) and cut candidates."""
    judge = PairRMJudge.from_pretrained(str(published_dir), max_length=32)
    tok, m = judge.tokenizer, judge.model
    sources = [case["source"] for case in REFERENCE["cases"]]
    cands = [case["candidates"] for case in REFERENCE["cases"]]
    expected = [
        (p, i, j, encode_pair(tok, m.settings, m.prefix_ids, sources[p], c[i], c[j]))
        for p, c in enumerate(cands)
        for i in range(len(c))
        for j in range(len(c))
        if i != j
    ]
    assert encode_prompts(tok, m.settings, m.prefix_ids, sources, cands) == expected
    assert len({len(ids) for *_, ids in expected}) > 3  # lengths vary, so sorted batches differ from arrival order
    assert encode_prompts(tok, m.settings, m.prefix_ids, [], []) == []


def test_length_sorted_batches_give_each_pair_its_own_logit(published_dir):
    """Pairs of many lengths in length-sorted batches of 3: each logit is the pair's alone
    (batch of 1), in the caller's order, up to float32 rounding (padding is masked)."""
    case = REFERENCE["cases"][3]
    items = [(case["source"], a, b) for a in case["candidates"] for b in case["candidates"] if a != b]
    alone = PairRMJudge.from_pretrained(str(published_dir), batch_size=1).pair_logits(items)
    batched = PairRMJudge.from_pretrained(str(published_dir), batch_size=3).pair_logits(items)
    assert alone.shape == (12,) and alone.unique().numel() == 12
    assert_float_close(batched, alone, n_terms=PAIR_TERMS)


def test_one_sep_per_segment(published_dir):
    """[CLS] <|source|> x [SEP] [CLS] <|candidate1|> a [SEP] [CLS] <|candidate2|> b [SEP]; a [SEP]
    written in a text becomes a space, as in llm-blender's collator."""
    judge = PairRMJudge.from_pretrained(str(published_dir))
    tok, m = judge.tokenizer, judge.model
    ids = encode_pair(tok, m.settings, m.prefix_ids, "hello", "hi [SEP] yes", "no")
    assert ids.count(tok.sep_token_id) == 3 and ids.count(tok.cls_token_id) == 3
    for prefix in (SOURCE_PREFIX, CAND1_PREFIX, CAND2_PREFIX):
        k = ids.index(m.prefix_ids[prefix])
        assert ids[k - 1] == tok.cls_token_id and (k == 1 or ids[k - 2] == tok.sep_token_id)
    assert ids[-1] == tok.sep_token_id


def test_published_layout_errors(published_dir, tmp_path):
    d = tmp_path / "ranker"
    shutil.copytree(published_dir, d)
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, "ranker_type": "summareranker"}))
    with pytest.raises(
        ValueError, match=r"config.json: ranker_type 'summareranker'.*PairRM is ranker_type 'pairranker'"
    ):
        PairRMJudge.from_pretrained(str(d))
    (d / "config.json").write_text(json.dumps({**raw, "model_name": "nobody/no-such-backbone"}))  # offline in tests
    with pytest.raises(
        FileNotFoundError, match="model_name 'nobody/no-such-backbone' .* Fetch them once: hf download"
    ):
        PairRMJudge.from_pretrained(str(d))
    (d / "config.json").write_text(json.dumps({**raw, "model_name": None}))
    with pytest.raises(ValueError, match="config.json: model_name is empty; it names the DeBERTa backbone"):
        PairRMJudge.from_pretrained(str(d))
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        PairRMJudge.from_pretrained(str(d))


def test_settings_capped():
    """PairRM's 1224 : 412 : 412 split of 2048 tokens, scaled to 1024: source 1024 * 1224 // 2048 = 612,
    candidates (1024 - 612) // 2 = 206."""
    s = PairRMSettings().capped(1024)
    assert (s.source_maxlength, s.candidate_maxlength) == (612, 206)
    assert PairRMSettings().capped(None) == PairRMSettings()


# ---- PairRM-hf layout, word-level tokenizer ----------------------------------------------


def _tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    vocab = {t: i for i, t in enumerate(specials + list(" abcdefghijklmnopqrstuvwxyz0123456789+=?.,!"))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    # DeBERTa's format: [CLS] text [SEP]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]"
    )


@pytest.fixture(scope="module")
def pairrm_dir(tmp_path_factory) -> Path:
    """The llm-blender/PairRM-hf layout: a DeBERTa-v2 config.json carrying the ranker fields,
    the tokenizer with the four prefix tokens, and the weights as a plain state dict."""
    from transformers import DebertaV2Config

    path = tmp_path_factory.mktemp("pairrm")
    tok = _tokenizer()
    ensure_prefix_tokens(tok)
    config = DebertaV2Config(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        relative_attention=True,
        position_buckets=32,
        max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        pad_token_id=tok.pad_token_id,
    )
    settings = PairRMSettings(n_tasks=3, source_maxlength=40, candidate_maxlength=20)
    torch.manual_seed(0)
    model = PairRMModel(config, settings, ensure_prefix_tokens(tok))
    config.update({"n_tasks": 3, "source_maxlength": 40, "candidate_maxlength": 20, "drop_out": 0.05})
    config.save_pretrained(path)
    tok.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")
    return path


def test_parameter_names_match_llm_blender(pairrm_dir):
    sd = torch.load(pairrm_dir / "pytorch_model.bin", weights_only=True)
    assert {"head_layer.1.weight", "head_layer.1.bias", "head_layer.4.weight", "head_layer.4.bias"} <= set(sd)
    assert "pretrained_model.embeddings.word_embeddings.weight" in sd
    assert any(k.startswith("pretrained_model.encoder.layer.1.attention.self.query_proj") for k in sd)
    assert sd["head_layer.1.weight"].shape == (32, 64) and sd["head_layer.4.weight"].shape == (3, 32)


def test_encode_layout(pairrm_dir):
    judge = PairRMJudge.from_pretrained(str(pairrm_dir))
    tok = judge.tokenizer
    ids = encode_pair(tok, judge.model.settings, judge.model.prefix_ids, "1+1=?", "2", "three")
    text = tok.convert_ids_to_tokens(ids)
    # [CLS] <|source|> ... [SEP] [CLS] <|candidate1|> 2 [SEP] [CLS] <|candidate2|> three [SEP]
    assert text[:2] == ["[CLS]", SOURCE_PREFIX] and text[-2:] == ["e", "[SEP]"] and text.count("[SEP]") == 3
    assert text.count(CAND1_PREFIX) == 1 and text.count(CAND2_PREFIX) == 1
    assert text[text.index(CAND1_PREFIX) + 1] == "2"
    long = encode_pair(tok, judge.model.settings, judge.model.prefix_ids, "x" * 500, "y" * 500, "z" * 500)
    assert len(long) <= 40 + 2 * (20 + 0) + 2  # truncated to the configured budgets
    assert len(long) == 40 + 2 * 20  # a full source leaves the candidates their own 20 each
    short = encode_pair(tok, judge.model.settings, judge.model.prefix_ids, "q", "y" * 500, "z" * 500)
    # source [CLS] <|source|> q [SEP] = 4 tokens: each candidate gets 20 + (40 - 4) // 2 = 38
    assert len(short) == 4 + 2 * 38


def test_loads_via_make_judge_and_shapes(pairrm_dir):
    judge = make_judge(JudgeConfig(type="pairrm", model=str(pairrm_dir), batch_size=3))
    assert isinstance(judge, PairRMJudge) and judge.model.settings.n_tasks == 3
    assert judge.model.settings.source_maxlength == 40  # judge.max_length unset: the checkpoint's
    verdicts = judge.preferences(["1+1=?", "2+2=?"], [["2", "3", "eleven"], ["4", "four"]])
    assert [v.matrix.shape for v in verdicts] == [(3, 3), (2, 2)]
    for v in verdicts:
        P = v.matrix
        assert torch.allclose(P + P.T, torch.ones_like(P)) and torch.all(P.diagonal() == 0.5)
        assert ((P >= 0) & (P <= 1)).all() and v.abstained_pairs == 0
    assert judge.stats.calls == 3 * 2 + 2 * 1


def test_swapping_inputs_and_padding(pairrm_dir):
    """Swapping the two candidates is an independent forward (no exact antisymmetry: positions
    differ), which is why every ordered pair is judged. Padding in a batch never changes a
    pair's logit. The matrices: both orders P[i, j] = (p(i, j) + 1 - p(j, i)) / 2; the authors'
    sigmoid(s_i - s_j) with s_i = mean_j (C_ij - C_ji), here K = 2: s_0 = (C_01 - C_10) / 2 = -s_1."""
    judge = PairRMJudge.from_pretrained(str(pairrm_dir), batch_size=8, mode="both_orders")
    items = [("1+1=?", "2", "a long wrong answer"), ("1+1=?", "a long wrong answer", "2"), ("q", "x", "y")]
    batched = judge.pair_logits(items)
    single = torch.cat([judge.pair_logits([it]) for it in items])
    assert_float_close(batched, single, n_terms=PAIR_TERMS)
    # a logit's rounding moves a preference built from it by at most as much (sigmoid' <= 1/4; the
    # authors' difference of two logits: twice that)
    logit_tol = 2 * float_tolerance(torch.float32, PAIR_TERMS, single.abs().max().item())["atol"]
    (v,) = judge.preferences(["1+1=?"], [["2", "a long wrong answer"]])
    p_ab, p_ba = torch.sigmoid(single[:2]).double()
    assert v.matrix[0, 1].item() == pytest.approx(((p_ab + 1 - p_ba) / 2).item(), abs=logit_tol)
    authors = PairRMJudge(judge.model, judge.tokenizer, mode="authors")
    (a,) = authors.preferences(["1+1=?"], [["2", "a long wrong answer"]])
    c01, c10 = single[:2].double()
    assert a.matrix[0, 1].item() == pytest.approx(torch.sigmoid(c01 - c10).item(), abs=logit_tol)
    # Permutation equivariance: reversing the candidates permutes the matrix.
    cands = ["2", "3", "eleven"]
    for j in (judge, authors):
        (a,) = j.preferences(["1+1=?"], [cands])
        (b,) = j.preferences(["1+1=?"], [cands[::-1]])
        perm = torch.tensor([2, 1, 0])
        assert torch.allclose(a.matrix, b.matrix[perm][:, perm], rtol=0, atol=logit_tol)


def test_independent_forward(pairrm_dir):
    """The logit equals head([h_src; h_c1]) - head([h_src; h_c2]) averaged over tasks, computed here
    from the raw encoder output at hand-found positions."""
    judge = PairRMJudge.from_pretrained(str(pairrm_dir))
    m, tok = judge.model, judge.tokenizer
    ids = encode_pair(tok, m.settings, m.prefix_ids, "5+5=?", "10", "ten")
    with torch.no_grad():
        h = m.pretrained_model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # (T, H)
        pos = {name: ids.index(m.prefix_ids[name]) for name in (SOURCE_PREFIX, CAND1_PREFIX, CAND2_PREFIX)}
        s1 = m.head_layer(torch.cat([h[pos[SOURCE_PREFIX]], h[pos[CAND1_PREFIX]]]))
        s2 = m.head_layer(torch.cat([h[pos[SOURCE_PREFIX]], h[pos[CAND2_PREFIX]]]))
    scale = max(s1.abs().max().item(), s2.abs().max().item())
    tol = float_tolerance(torch.float32, PAIR_TERMS, scale)
    assert judge.pair_logits([("5+5=?", "10", "ten")]).item() == pytest.approx(
        (s1 - s2).mean().item(), abs=2 * tol["atol"]
    )


def test_wrong_checkpoint_errors(pairrm_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no pytorch_model.bin"):
        d = tmp_path / "noweights"
        shutil.copytree(pairrm_dir, d)
        (d / "pytorch_model.bin").unlink()
        PairRMJudge.from_pretrained(str(d))
    d = tmp_path / "headless"
    shutil.copytree(pairrm_dir, d)
    sd = torch.load(d / "pytorch_model.bin", weights_only=True)
    torch.save({k: v for k, v in sd.items() if not k.startswith("head_layer.4")}, d / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"weights do not match PairRM's layout \(missing \['head_layer.4"):
        PairRMJudge.from_pretrained(str(d))


class FixedCandidates:
    """A generate backend answering every prompt with the same three candidates."""

    name = "fixed"

    def generate(self, prompts, n, sampling):
        return [["4", "four", "5"][:n] for _ in prompts]


def test_pipeline_and_evaluation_give_pairrm_the_same_chat_templated_prompt(pairrm_dir, tiny_policy, tmp_path):
    """PairRM's source is the prompt as the policy saw it (the SPPO scripts rank with the
    chat-templated prompt), in the judge stage and in evaluation alike: the prompts its
    `preferences` receives from `run_pipeline` and from evaluation's `judge_models` (with
    `render_prompts`, as `axolotl pofe eval` renders them) are the same strings, the policy's
    chat template applied, not the dataset's prompt."""
    from transformers import AutoTokenizer

    from pofe.run.evaluation.inputs import render_prompts
    from pofe.run.evaluation.judging import judge_models
    from pofe_candidates.config import CandidatesConfig, GenerateConfig
    from pofe_candidates.pipeline import run_pipeline
    from pofe_candidates.render import render_prompt

    judge = PairRMJudge.from_pretrained(str(pairrm_dir))
    received, preferences = [], judge.preferences

    def spy(prompts, responses):
        received.append(list(prompts))
        return preferences(prompts, responses)

    judge.preferences = spy
    prompts = ["2+2=", [{"role": "user", "content": "1+3="}]]
    run_pipeline(
        [{"prompt": p} for p in prompts],
        policy_path=str(tiny_policy),
        method="sppo",
        judge=JudgeConfig(type="pairrm", model=str(pairrm_dir)),
        generate=GenerateConfig(num_candidates=3, max_new_tokens=4),
        candidates=CandidatesConfig(out_dir=str(tmp_path), progress=False),
        generator=FixedCandidates(),
        judge_impl=judge,
    )
    tok = AutoTokenizer.from_pretrained(tiny_policy)
    out = judge_models(judge, prompts, render_prompts(tok, prompts), [[["4"], ["four"]], [["5"], ["4"]]])
    assert out["method"] == "pairwise" and len(received) == 2
    pipeline_prompts, eval_prompts = received
    assert pipeline_prompts == eval_prompts == [render_prompt(tok, p).text for p in prompts]
    assert eval_prompts == [
        tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
        for c in ("2+2=", "1+3=")
    ]
    assert eval_prompts[0] != "2+2=" and "<|user|>2+2=" in eval_prompts[0]  # the template's markers
