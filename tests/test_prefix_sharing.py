"""Prefix sharing (pofe.prefix) is invisible to the losses.

Invariances, each in values and gradients to float32 tolerance for the sums involved
(`tests.helpers.float_tolerance`: 4 eps sqrt(n) |max|, n = width x tokens, about 4e-5),
for both layouts of a shared batch (`packed` rows with a block mask, the prompt's KV
`cache`): shared == unshared (eager, sdpa, LoRA, gradient checkpointing), padding
changes nothing, and micro-batch 1 x accumulation 4 == micro-batch 4 x 1 for the RRHF
loss.
"""

from __future__ import annotations

import pytest
import torch

from pofe.args import pofe_config
from pofe.collator import KResponseCollator
from pofe.columns import IGNORE_INDEX, pack_prompt
from pofe.losses import rrhf_loss
from pofe.prefix import block_attention_mask, prefix_sharing_enabled
from pofe.scoring import score_candidates, scored_positions_packed
from tests.helpers import assert_float_close, features, load_llama, n_terms

LAYOUTS = ("packed", "cache")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(model, fn):
    """fn(model) and the gradients of sum(weights * value) w.r.t. the trainable parameters."""
    model.zero_grad(set_to_none=True)
    value = fn(model)
    weights = torch.linspace(0.5, 1.5, value.numel()).view_as(value)
    (weights * value).sum().backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_same(a, b, feats):
    """Values and gradients of `run` agree to float32 rounding of sums over `feats`."""
    (va, ga), (vb, gb) = a, b
    n = n_terms(feats)
    assert_float_close(va, vb, n)
    assert ga.keys() == gb.keys() and ga
    for name in ga:
        assert_float_close(ga[name], gb[name], n, msg=lambda m, name=name: f"{name}: {m}")


def both_layouts(model, tokenizer, feats, layout="packed", **collator_kwargs):
    unshared = KResponseCollator(tokenizer, **collator_kwargs)(feats)
    shared = KResponseCollator(tokenizer, prefix_sharing=True, **collator_kwargs)(feats)
    return (
        run(model, lambda m: score_candidates(m, unshared, chunk_size=7)[0]),
        run(model, lambda m: score_candidates(m, shared, chunk_size=7, prefix_layout=layout)[0]),
    )


# ---------------------------------------------------------------- layout, by hand
def test_pack_prompt_by_hand():
    """prompt [a, b], responses [c, d], [e]: positions restart at P = 2 for each response."""
    tokens, segments, positions = pack_prompt([10, 11], [[12, 13], [14]])
    assert tokens == [10, 11, 12, 13, 14]
    assert segments == [0, 0, 1, 1, 2]
    assert positions == [0, 1, 2, 3, 2]


def test_block_mask_by_hand():
    """Segments [0, 0, 1, 1, 2, -1] (a, b | c, d | e | pad). Rows are queries, columns keys.

    a: a          b: a b         c: a b c       d: a b c d
    e: a b . . e  (not c, d: another response)   pad: itself only
    """
    seg = torch.tensor([[0, 0, 1, 1, 2, -1]])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(block_attention_mask(seg, "sdpa", torch.float32)[0, 0], expected)
    eager = block_attention_mask(seg, "eager", torch.float32)[0, 0]
    assert torch.equal(eager == 0, expected)
    assert bool((eager[~expected] == torch.finfo(torch.float32).min).all())
    with pytest.raises(ValueError, match="prefix_sharing: false"):
        block_attention_mask(seg, "flash_attention_2", torch.float32)


def test_scored_positions_packed_by_hand():
    """Row [a, b, c, d, e, pad]: c is predicted at b (1), d at c (2), e at b (1) again.

    Row 2 has an empty prompt: its first response token has no predictor (as unshared).
    """
    ids = torch.tensor([[10, 11, 12, 13, 14, 0], [20, 21, 22, 0, 0, 0]])
    seg = torch.tensor([[0, 0, 1, 1, 2, -1], [1, 1, 2, -1, -1, -1]])
    mask = torch.tensor([[True, True], [True, True]])
    src, tgt, cand = scored_positions_packed(ids, seg, mask)
    assert src.tolist() == [1, 2, 1, 6 + 0]
    assert tgt.tolist() == [12, 13, 14, 21]
    assert cand.tolist() == [0, 0, 1, 2]


def test_collator_packed_layout(tokenizer):
    feats = [
        {"prompt_ids": [10, 11], "response_ids": [[12, 13], [14]], "rewards": [1.0, 0.0]},
        {"prompt_ids": [20], "response_ids": [[21]], "rewards": [0.5]},
    ]
    batch = KResponseCollator(tokenizer, prefix_sharing=True, pad_to_multiple_of=8)(feats)
    pad, x = tokenizer.pad_token_id, IGNORE_INDEX
    assert batch["input_ids"].tolist() == [[10, 11, 12, 13, 14] + [pad] * 3, [20, 21] + [pad] * 6]
    assert batch["segment_ids"].tolist() == [[0, 0, 1, 1, 2, -1, -1, -1], [0, 1] + [-1] * 6]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 2, 0, 0, 0], [0, 1] + [0] * 6]
    assert batch["labels"].tolist() == [[x, x, 12, 13, 14, x, x, x], [x, 21] + [x] * 6]
    assert batch["candidate_mask"].tolist() == [[True, True], [True, False]]
    assert batch["rewards"].tolist() == [[1.0, 0.0], [0.5, 0.0]]


# ---------------------------------------------------------------- shared == unshared
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_shared_equals_unshared(tiny64_model, tokenizer, attn, layout):
    model = load_llama(tiny64_model, attn)
    unshared, shared = both_layouts(model, tokenizer, features(), layout)
    assert_same(shared, unshared, features())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shared_padding_changes_nothing(tiny64_model, tokenizer, layout):
    model = load_llama(tiny64_model)
    feats = features()
    plain = KResponseCollator(tokenizer, prefix_sharing=True)(feats)
    padded = KResponseCollator(tokenizer, prefix_sharing=True, pad_to_multiple_of=128)(feats)
    score = lambda m, b: score_candidates(m, b, prefix_layout=layout)  # noqa: E731
    assert_same(run(model, lambda m: score(m, padded)[0]), run(model, lambda m: score(m, plain)[0]), feats)
    assert torch.equal(score(model, padded)[1], score(model, plain)[1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shared_equals_unshared_empty_prompt(tiny64_model, tokenizer, layout):
    """No prompt: the first response token is scored by neither layout (lengths n - 1)."""
    model = load_llama(tiny64_model)
    feats = features(prompt_lens=(0, 4), k_lens=((3, 5), (2, 1)))
    unshared = KResponseCollator(tokenizer)(feats)
    shared = KResponseCollator(tokenizer, prefix_sharing=True)(feats)
    lengths = score_candidates(model, shared, prefix_layout=layout)[1]
    assert lengths.tolist() == [[2, 4], [2, 1]]
    assert torch.equal(lengths, score_candidates(model, unshared)[1])
    assert_same(*both_layouts(model, tokenizer, feats, layout)[::-1], feats)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shared_equals_unshared_lora(tiny64_model, tokenizer, layout, lora_seed=0):
    peft = pytest.importorskip("peft")
    torch.manual_seed(lora_seed)  # the adapters' random init
    model = peft.get_peft_model(
        load_llama(tiny64_model, "sdpa"),
        peft.LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"],
            init_lora_weights=False,
        ),
    )
    unshared, shared = both_layouts(model, tokenizer, features(), layout)
    assert_same(shared, unshared, features())


@pytest.mark.parametrize("reentrant, layout", [(False, "packed"), (True, "packed"), (False, "cache"), (True, "auto")])
def test_shared_equals_unshared_gradient_checkpointing(tiny64_model, tokenizer, reentrant, layout):
    """Reentrant checkpointing only with `auto`, which then packs (the cache layout refuses it)."""
    model = load_llama(tiny64_model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:
        model.enable_input_require_grads()  # what HF/PEFT do so reentrant checkpoints see a grad input
    unshared, shared = both_layouts(model, tokenizer, features(), layout)
    assert_same(shared, unshared, features())
    reference = load_llama(tiny64_model)  # and both equal the model without checkpointing
    assert_same(shared, both_layouts(reference, tokenizer, features())[0], features())


# ---------------------------------------------------------------- accumulation invariance
@pytest.mark.parametrize("layout", LAYOUTS)
def test_microbatch_1x4_equals_4x1_rrhf(tiny64_model, tokenizer, layout):
    """grad of mean_b L_b over 4 prompts == sum over 4 micro-batches of grad(L_b) / 4.

    What the Trainer does with gradient accumulation (our losses are means over
    prompts and `model_accepts_loss_kwargs` is False, so it divides by the steps).
    """
    model = load_llama(tiny64_model)
    feats = features()
    collate = KResponseCollator(tokenizer, prefix_sharing=True)

    def loss_of(batch):
        logp, lengths = score_candidates(model, batch, chunk_size=5, prefix_layout=layout)
        return rrhf_loss(logp, lengths, batch["rewards"], mask=batch["candidate_mask"], margin=0.1)[0]

    model.zero_grad(set_to_none=True)
    loss_of(collate(feats)).backward()
    full = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)
    for f in feats:
        (loss_of(collate([f])) / len(feats)).backward()  # gradients accumulate in .grad
    for name, p in model.named_parameters():
        assert_float_close(p.grad, full[name], n_terms(feats), msg=lambda m, name=name: f"{name}: {m}")


# ---------------------------------------------------------------- fallback
def enabled(cfg, is_eval=False):
    """`prefix_sharing_enabled` as the plugin's hook calls it: with the config's validated block."""
    return prefix_sharing_enabled(cfg, pofe_config(cfg), is_eval)


@pytest.mark.parametrize(
    "cfg, expected",
    [
        ({"pofe": {"method": "rrhf"}}, True),
        ({"pofe": {"method": "rrhf"}, "attn_implementation": "sdpa"}, True),
        ({"pofe": {"method": "rrhf"}, "attn_implementation": "eager"}, True),
        ({"pofe": {"method": "rrhf", "prefix_sharing": False}}, False),
        # no 4D mask: the cache layout, unless reentrant checkpointing would cut its gradient
        ({"pofe": {"method": "rrhf"}, "attn_implementation": "flash_attention_2"}, True),
        ({"pofe": {"method": "rrhf"}, "attn_implementation": "flex_attention"}, True),
        (
            {
                "pofe": {"method": "rrhf"},
                "attn_implementation": "flash_attention_2",
                "gradient_checkpointing": True,
                "gradient_checkpointing_kwargs": {"use_reentrant": True},
            },
            False,
        ),
        (
            {
                "pofe": {"method": "rrhf"},
                "attn_implementation": "flash_attention_2",
                "gradient_checkpointing": True,
                "gradient_checkpointing_kwargs": {"use_reentrant": False},
            },
            True,
        ),
        (
            {
                "pofe": {"method": "rrhf"},
                "attn_implementation": "sdpa",
                "gradient_checkpointing": True,
                "gradient_checkpointing_kwargs": {"use_reentrant": True},
            },
            True,
        ),
        ({"pofe": {"method": "rrhf"}, "sample_packing": True}, False),
    ],
)
def test_prefix_sharing_enabled(cfg, expected):
    assert enabled(cfg) is expected


def test_prefix_sharing_eval_sample_packing():
    cfg = {"pofe": {"method": "sppo"}, "eval_sample_packing": True}
    assert enabled(cfg) is True
    assert enabled(cfg, is_eval=True) is False


def test_packed_batch_on_unsupported_backend_raises(tiny64_model, tokenizer):
    model = load_llama(tiny64_model)
    model.config._attn_implementation = "flash_attention_2"
    batch = KResponseCollator(tokenizer, prefix_sharing=True)(features())
    with pytest.raises(ValueError, match="prefix_layout: auto"):
        score_candidates(model, batch, prefix_layout="packed")


def test_packed_layout_on_unsupported_backend_is_a_config_error():
    cfg = {"pofe": {"method": "rrhf", "prefix_layout": "packed"}, "attn_implementation": "flash_attention_2"}
    with pytest.raises(ValueError, match="prefix_layout: packed needs attn_implementation"):
        enabled(cfg)


def test_config_defaults():
    from pofe.args import PofeConfig

    cfg = PofeConfig()
    assert cfg.prefix_sharing is True and cfg.logit_chunk_size == 1024 and cfg.prefix_layout == "auto"
    with pytest.raises(ValueError):
        PofeConfig(logit_chunk_size=0)


def test_cache_layout_with_reentrant_checkpointing_is_a_config_error():
    cfg = {
        "pofe": {"method": "rrhf", "prefix_layout": "cache"},
        "gradient_checkpointing": True,
        "gradient_checkpointing_kwargs": {"use_reentrant": True},
    }
    with pytest.raises(ValueError, match="prefix_layout: cache needs non-reentrant"):
        enabled(cfg)
    assert enabled(cfg, is_eval=True) is True  # no gradients in eval


@pytest.mark.parametrize(
    "layout, attn, reentrant, says",
    [
        ("auto", "flash_attention_2", False, "the prompts' KV cache (flash_attention_2 takes no 4D mask)"),
        ("auto", "sdpa", True, "packed rows with a block attention mask (reentrant gradient checkpointing)"),
        (
            "auto",
            None,
            False,
            "chosen per batch: the prompts' KV cache where packed rows would compute over 2x its "
            "attention scores, else packed rows with a block attention mask (pofe.prefix_layout: auto)",
        ),
        ("packed", "eager", False, "packed rows with a block attention mask"),
    ],
)
def test_log_line_names_the_layout(caplog, layout, attn, reentrant, says):
    cfg = {
        "pofe": {"method": "rrhf", "prefix_layout": layout},
        "attn_implementation": attn,
        "gradient_checkpointing": reentrant,
        "gradient_checkpointing_kwargs": {"use_reentrant": reentrant},
    }
    with caplog.at_level("INFO"):
        assert enabled(cfg) is True
    assert f"POFE (train): prefix sharing on, each prompt encoded once; layout {says}" in caplog.text
