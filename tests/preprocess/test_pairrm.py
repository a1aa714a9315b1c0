"""PairRM reimplementation: random weights in a tiny configuration, llm-blender's names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pofe.preprocess.config import JudgeConfig
from pofe.preprocess.judges import make_judge
from pofe.preprocess.pairrm import (
    CAND1_PREFIX,
    CAND2_PREFIX,
    SOURCE_PREFIX,
    PairRMJudge,
    PairRMModel,
    PairRMSettings,
    encode_pair,
    ensure_prefix_tokens,
)


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
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]")


@pytest.fixture(scope="module")
def pairrm_dir(tmp_path_factory) -> Path:
    """A directory laid out like llm-blender/PairRM: DeBERTa config.json, tokenizer with the four
    prefix tokens, ranker_config.json, and pytorch_model.bin as a plain state dict."""
    from transformers import DebertaV2Config

    path = tmp_path_factory.mktemp("pairrm")
    tok = _tokenizer()
    ensure_prefix_tokens(tok)
    config = DebertaV2Config(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=512, relative_attention=True, position_buckets=32, max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"], position_biased_input=False, pad_token_id=tok.pad_token_id,
    )
    settings = PairRMSettings(n_tasks=3, source_maxlength=40, candidate_maxlength=20)
    torch.manual_seed(0)
    model = PairRMModel(config, settings, ensure_prefix_tokens(tok))
    config.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "ranker_config.json").write_text(json.dumps({"n_tasks": 3, "source_maxlength": 40, "candidate_maxlength": 20, "drop_out": 0.05, "loss_type": "instructgpt"}))
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
    # [CLS] <|source|> ... [SEP] [SEP] [CLS] <|candidate1|> 2 [SEP] [SEP] [CLS] <|candidate2|> three [SEP] [SEP]
    assert text[:2] == ["[CLS]", SOURCE_PREFIX] and text[-2:] == ["[SEP]", "[SEP]"]
    assert text.count(CAND1_PREFIX) == 1 and text.count(CAND2_PREFIX) == 1
    assert text[text.index(CAND1_PREFIX) + 1] == "2"
    long = encode_pair(tok, judge.model.settings, judge.model.prefix_ids, "x" * 500, "y" * 500, "z" * 500)
    assert len(long) <= 40 + 2 * (20 + 0) + 2  # truncated to the configured budgets


def test_loads_via_make_judge_and_shapes(pairrm_dir):
    judge = make_judge(JudgeConfig(type="pairrm", model=str(pairrm_dir), batch_size=3))
    assert isinstance(judge, PairRMJudge) and judge.model.settings.n_tasks == 3
    verdicts = judge.preferences(["1+1=?", "2+2=?"], [["2", "3", "eleven"], ["4", "four"]])
    assert [v.matrix.shape for v in verdicts] == [(3, 3), (2, 2)]
    for v in verdicts:
        P = v.matrix
        assert torch.allclose(P + P.T, torch.ones_like(P)) and torch.all(P.diagonal() == 0.5)
        assert ((P >= 0) & (P <= 1)).all() and v.abstained_pairs == 0
    assert judge.stats.calls == 3 * 2 + 2 * 1


def test_swapping_inputs_and_padding(pairrm_dir):
    """Swapping the two candidates is an independent forward (no exact antisymmetry: positions
    differ), but it is what the both-orders matrix uses: P[i, j] = (p(i, j) + 1 - p(j, i)) / 2.
    Padding in a batch never changes a pair's logit."""
    judge = PairRMJudge.from_pretrained(str(pairrm_dir), batch_size=8)
    items = [("1+1=?", "2", "a long wrong answer"), ("1+1=?", "a long wrong answer", "2"), ("q", "x", "y")]
    batched = judge.pair_logits(items)
    single = torch.cat([judge.pair_logits([it]) for it in items])
    assert torch.allclose(batched, single, atol=1e-5)
    (v,) = judge.preferences(["1+1=?"], [["2", "a long wrong answer"]])
    p_ab, p_ba = torch.sigmoid(single[:2]).double()
    assert v.matrix[0, 1].item() == pytest.approx(((p_ab + 1 - p_ba) / 2).item(), abs=1e-6)
    # Permutation equivariance: reversing the candidates permutes the matrix.
    cands = ["2", "3", "eleven"]
    (a,) = judge.preferences(["1+1=?"], [cands])
    (b,) = judge.preferences(["1+1=?"], [cands[::-1]])
    perm = torch.tensor([2, 1, 0])
    assert torch.allclose(a.matrix, b.matrix[perm][:, perm], atol=1e-6)


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
    assert judge.pair_logits([("5+5=?", "10", "ten")]).item() == pytest.approx((s1 - s2).mean().item(), abs=1e-5)


def test_wrong_checkpoint_errors(pairrm_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="no pytorch_model.bin"):
        import shutil

        d = tmp_path / "noweights"
        shutil.copytree(pairrm_dir, d)
        (d / "pytorch_model.bin").unlink()
        PairRMJudge.from_pretrained(str(d))
