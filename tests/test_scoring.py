"""Memory-light scoring (pofe.scoring) against the naive full-logits reference.

The fast path gathers only the positions that predict a response token and runs the
output embedding on them in checkpointed chunks; the reference materialises
(N, T, vocab) logits. Both must agree, in values and in gradients, to float32
tolerance for the sums involved (`tests.helpers.float_tolerance`), with padding, varied
lengths, LoRA and no grad.
"""

from __future__ import annotations

import pytest
import torch

from pofe.collator import KResponseCollator
from pofe.columns import IGNORE_INDEX
from pofe.scoring import (
    response_logps,
    response_logps_reference,
    score_candidates,
    scored_positions_unshared,
    token_logps,
)
from tests.helpers import assert_float_close, load_llama, n_terms

# the reference path is TRL's selective_log_softmax
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.trl]


def features(seed=0, prompt_lens=(5, 9, 3), k_lens=((3, 7, 1), (4, 2), (6, 6, 2, 5))):
    """Prompts and candidates of varied lengths (so rows get padded), random token ids."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(7, 100, (n,), generator=g).tolist()  # noqa: E731
    return [
        {
            "prompt_ids": rand(p),
            "response_ids": [rand(n) for n in lens],
            "rewards": list(range(len(lens))),
        }
        for p, lens in zip(prompt_lens, k_lens)
    ]


def weights_like(t: torch.Tensor) -> torch.Tensor:
    """Fixed distinct weights, so the test objective depends on every candidate separately."""
    return torch.linspace(0.5, 1.5, t.numel()).view_as(t)


def run(model, fn):
    """Value of fn(model) and the gradients of sum(weights * value) w.r.t. trainable params."""
    model.zero_grad(set_to_none=True)
    value = fn(model)
    (weights_like(value) * value).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return value.detach(), grads


def assert_grads_close(a: dict, b: dict, n: int) -> None:
    """Gradients agree to float32 rounding of sums of `n` terms (`float_tolerance`)."""
    assert a.keys() == b.keys()
    for name in a:
        assert_float_close(a[name], b[name], n, msg=lambda m, name=name: f"{name}: {m}")


def reference_bk(model, batch):
    logp, n = response_logps_reference(model, batch["input_ids"], batch["attention_mask"], batch["labels"])
    mask = batch["candidate_mask"]
    return logp.new_zeros(mask.shape).masked_scatter(mask, logp), n.new_zeros(mask.shape).masked_scatter(mask, n)


def test_scored_positions_unshared_by_hand():
    """labels row 0: [-, -, 5, 6] -> positions 1, 2 predict 5, 6; row 1: [-, 7, -, -] -> 0 predicts 7."""
    x = IGNORE_INDEX
    labels = torch.tensor([[x, x, 5, 6], [x, 7, x, x]])
    src, tgt, row = scored_positions_unshared(labels)
    assert src.tolist() == [1, 2, 4 + 0]
    assert tgt.tolist() == [5, 6, 7]
    assert row.tolist() == [0, 0, 1]


def test_token_logps_chunked_equals_log_softmax():
    """Chunking over rows (chunk 1, 3, all) gives log_softmax(head(h))[t], values and grads."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(7, 8, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    full = torch.log_softmax(head(hidden), -1).gather(-1, targets[:, None]).squeeze(-1)
    g_full = torch.autograd.grad(full.sum(), (hidden, head.weight))
    n = 8 * 7  # width x rows: the head's sums, and its weight's gradient over the rows
    for chunk in (1, 3, 100):
        out = token_logps(head, hidden, targets, chunk)
        assert_float_close(out, full, n)
        for a, b in zip(torch.autograd.grad(out.sum(), (hidden, head.weight)), g_full):
            assert_float_close(a, b, n)


def test_token_logps_chunk_order():
    """M = 7, chunk 3: the ragged chunk comes first (1, 3, 3); in backward only the
    checkpointed chunks (the first two) run the head again, the last keeps its logits."""
    head = torch.nn.Linear(4, 5, bias=False)
    seen = []
    head.register_forward_hook(lambda mod, inp, out: seen.append(out.shape[0]))
    out = token_logps(head, torch.randn(7, 4, requires_grad=True), torch.zeros(7, dtype=torch.long), 3)
    assert seen == [1, 3, 3]
    out.sum().backward()
    assert sorted(seen[3:]) == [1, 3]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("chunk", [1, 5, 1024])
def test_chunked_equals_full_logits(tiny64_model, tokenizer, attn, chunk):
    model = load_llama(tiny64_model, attn)
    batch = KResponseCollator(tokenizer)(features())
    fast, g_fast = run(model, lambda m: score_candidates(m, batch, chunk_size=chunk)[0])
    ref, g_ref = run(model, lambda m: reference_bk(m, batch)[0])
    assert_float_close(fast, ref, n_terms(features()))
    assert_grads_close(g_fast, g_ref, n_terms(features()))
    assert torch.equal(score_candidates(model, batch)[1], reference_bk(model, batch)[1])


def test_padding_changes_nothing(tiny64_model, tokenizer):
    """Extra right padding, and a batch-mate that makes the rows longer, leave each score as is."""
    model = load_llama(tiny64_model)
    feats = features()
    plain = score_candidates(model, KResponseCollator(tokenizer)(feats))
    padded = score_candidates(model, KResponseCollator(tokenizer, pad_to_multiple_of=64)(feats))
    alone = score_candidates(model, KResponseCollator(tokenizer)(feats[1:2]))
    assert_float_close(padded[0], plain[0], n_terms(feats))
    assert torch.equal(padded[1], plain[1])
    assert_float_close(alone[0][0], plain[0][1, :2], n_terms(feats))


def test_no_grad_path_matches(tiny64_model, tokenizer):
    """The anchor pass runs under no_grad (no checkpointing): same numbers."""
    model = load_llama(tiny64_model)
    batch = KResponseCollator(tokenizer)(features())
    with torch.no_grad():
        fast = score_candidates(model, batch, chunk_size=4)[0]
        ref = reference_bk(model, batch)[0]
    assert_float_close(fast, ref, n_terms(features()))


def test_response_logps_never_builds_full_logits(tiny64_model, tokenizer):
    """The model's own head sees only the last position (logits_to_keep=1)."""
    model = load_llama(tiny64_model)
    batch = KResponseCollator(tokenizer)(features())
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(tuple(out.shape)))
    try:
        response_logps(model, batch["input_ids"], batch["attention_mask"], batch["labels"], chunk_size=8)
    finally:
        hook.remove()
    n_tokens = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    vocab = model.config.vocab_size
    assert seen[0] == (batch["input_ids"].shape[0], 1, vocab)  # the model's own call
    assert all(s[0] <= 8 for s in seen[1:])  # our chunks
    assert sum(s[0] for s in seen[1:]) == n_tokens


def test_lora_with_lora_on_lm_head(tiny64_model, tokenizer):
    """Through a PEFT wrapper, with an adapter on lm_head (called, not bypassed via .weight)."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)  # the adapters' random init
    model = peft.get_peft_model(
        load_llama(tiny64_model),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False),
    )
    batch = KResponseCollator(tokenizer)(features())
    fast, g_fast = run(model, lambda m: score_candidates(m, batch, chunk_size=5)[0])
    ref, g_ref = run(model, lambda m: reference_bk(m, batch)[0])
    assert_float_close(fast, ref, n_terms(features()))
    assert any("lm_head" in n for n in g_fast)
    assert_grads_close(g_fast, g_ref, n_terms(features()))


def test_second_backward_through_kept_chunk_raises():
    """The kept chunk's logits become its gradient in place: a retain_graph re-run must fail loudly."""
    head = torch.nn.Linear(4, 5, bias=False)
    out = token_logps(head, torch.randn(3, 4), torch.zeros(3, dtype=torch.long), 8)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        out.sum().backward()
