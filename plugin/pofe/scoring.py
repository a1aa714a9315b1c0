"""Summed response log-probs per candidate: the score both methods are built on.

Memory-light: the model returns its final hidden states (``output_hidden_states=True,
logits_to_keep=1``, so no (N, T, vocab) logits tensor is ever built), the positions that
predict a response token are gathered, and only those go through the output embedding,
``chunk_size`` tokens at a time. Under autograd all chunks but the last are
checkpointed: their (C, vocab) logits are recomputed in the backward pass instead of
being kept, so scoring holds one chunk of logits at a time, whatever the batch.

Two batch layouts reach :func:`score_candidates` (see ``pofe.collator``):

- unshared: N = sum_b k_b rows ``prompt + response``, labels on the response tokens;
  the token at t + 1 is predicted by the hidden state at t.
- prefix-shared (the batch carries ``segment_ids``): one row per prompt,
  ``prompt, r_1, ..., r_k``, run either as it is with a block attention mask or as the
  prompts and then the responses over the prompts' KV cache (``pofe.prefix``,
  ``pofe.prefix_cache``). The first token of every response is predicted by the last
  prompt position, every later token by the previous token of the same response.

All give the same (B, K) log-probs and lengths: the trainers cannot tell them apart.

Under sharded models the output embedding is called apart from the forward only where
that is exact (`pofe.modeling.head_outside_forward`); elsewhere (ZeRO-3, FSDP1, FSDP2 with
the head as its own unit) the model's forward runs its head on every position and the
log-probs are read off those logits (a log line says so; more memory, same numbers).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from pofe.columns import DEFAULT_LOGIT_CHUNK_SIZE, IGNORE_INDEX
from pofe.compat.modeling import reentrant_checkpointing
from pofe.logs import get_logger
from pofe.modeling import attention_backend, head_outside_forward, logits_are_plain, mask_dtype, output_embedding
from pofe.prefix import block_attention_mask, check_backend, choose_layout
from pofe.prefix_cache import cache_hidden_states

LOG = get_logger(__name__)

_LSE_ROWS = 256  # rows per logsumexp slice: its exp() temporary is _LSE_ROWS x vocab


class _GatherLogSoftmax(torch.autograd.Function):
    """log_softmax(logits)[target] for logits (C, V) -> (C,), holding ONE (C, V) buffer.

    Forward takes the logsumexp in row slices (temporaries of _LSE_ROWS x V) and saves
    only the logits. Backward turns the saved logits into the gradient
    g * (onehot - softmax) in place and returns them: nothing else reads the logits
    (the head's backward needs its input and weight, not its output), so no second
    (C, V) buffer is ever allocated. autograd's own gather + logsumexp holds three or
    four. The price: this node's backward runs once (no `retain_graph` reuse).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lse = torch.empty(logits.shape[0], dtype=logits.dtype, device=logits.device)  # (C,)
        for start in range(0, logits.shape[0], _LSE_ROWS):
            lse[start : start + _LSE_ROWS] = torch.logsumexp(logits[start : start + _LSE_ROWS], dim=-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.consumed = False
        return logits.gather(-1, targets[:, None]).squeeze(-1) - lse

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.consumed:
            raise RuntimeError(
                "POFE's chunked log-softmax frees its logits in backward; "
                "a second backward through the same graph is not supported"
            )
        ctx.consumed = True
        logits, targets, lse = ctx.saved_tensors
        out = logits.sub_(lse[:, None]).exp_().mul_(-grad[:, None])  # (C, V) = -g * softmax, in place
        out.scatter_add_(-1, targets[:, None], grad[:, None])
        return out, None


def _chunk_logps(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(head(hidden))[target] in float32. hidden (C, H), targets (C,) -> (C,)."""
    logits = head(hidden).float()  # (C, V) float32; a fresh copy when the head runs in bf16
    return _GatherLogSoftmax.apply(logits, targets)


def token_logps(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int = DEFAULT_LOGIT_CHUNK_SIZE,
) -> torch.Tensor:
    """Log-probs of `targets` under `head` at `hidden`, `chunk_size` rows at a time.

    Args:
        head: the output embedding module (called, so adapters on it take part).
        hidden: (M, H) final hidden states of the predicting positions.
        targets: (M,) token ids.
        chunk_size: rows per chunk; scoring holds one chunk_size x vocab float32
            logits buffer at a time (two with a bf16 head: its output and the copy).

    Returns:
        (M,) float32.

    Under autograd every chunk but the last is checkpointed: its logits are
    recomputed in the backward pass instead of kept. The last chunk keeps its logits:
    its backward runs first, so keeping them costs no more peak memory than
    recomputing them would, and saves a head matmul. The ragged chunk goes first, so
    the kept one is a full chunk (M <= chunk_size: nothing is recomputed).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    m = hidden.shape[0]
    if m == 0:
        return hidden.new_zeros(0, dtype=torch.float32)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    first = m - chunk_size * ((m - 1) // chunk_size)  # in [1, chunk_size]
    bounds = [0, *range(first, m + 1, chunk_size)]
    out = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        h, t = hidden[start:end], targets[start:end]
        if grad and end < m:
            out.append(checkpoint(_chunk_logps, head, h, t, use_reentrant=False))
        else:
            out.append(_chunk_logps(head, h, t))
    return torch.cat(out)  # (M,)


def final_hidden_states(model: torch.nn.Module, head_in_forward: bool = False, **inputs) -> torch.Tensor:
    """(rows, T, H) hidden states after the final norm, without the full logits.

    `logits_to_keep=1` makes the head run on the last position only; the hidden states
    come from `output_hidden_states` (transformers ties `hidden_states[-1]` to the
    normed `last_hidden_state`). Calling the top-level model keeps PEFT, DDP,
    DeepSpeed and gradient checkpointing hooks in play. With `head_in_forward` these
    are the (rows, T, vocab) logits instead, the head run inside the forward.
    """
    if head_in_forward:
        return model(**inputs, use_cache=False, logits_to_keep=0).logits
    out = model(**inputs, use_cache=False, output_hidden_states=True, logits_to_keep=1)
    hidden = getattr(out, "hidden_states", None)
    if hidden is None:
        raise ValueError(f"{type(model).__name__}.forward returned no hidden_states")
    return hidden[-1]


class _ComputedLogits(torch.nn.Module):
    """The head for logits the forward already computed: a float32 copy of each chunk.

    A copy, because the chunked log-softmax's backward overwrites its input in place.
    """

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.to(torch.float32, copy=True)


def scoring_head(model: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """The head scoring applies to the gathered states, and whether the forward runs the real one.

    Where the output embedding cannot run apart from the forward
    (:func:`pofe.modeling.head_outside_forward` says why), the forward returns logits
    and the head applied to them copies them.
    """
    reason = head_outside_forward(model)
    if reason is None:
        return output_embedding(model), False
    LOG.warning_once(
        f"POFE: {reason}; the model's forward runs it on every position "
        "(full logits: more memory than chunked scoring, the same log-probs)"
    )
    return _ComputedLogits(), True


def scored_positions_unshared(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which hidden state predicts which label, for the unshared (N, T) layout.

    Returns flat source indices into the (N * T) hidden states, target ids and the
    row of each, all (M,), in row-major order.
    """
    n, t = labels.shape
    scored = labels[:, 1:] != IGNORE_INDEX  # (N, T-1): token t+1 is predicted at position t
    rows, cols = scored.nonzero(as_tuple=True)  # (M,)
    return rows * t + cols, labels[:, 1:][rows, cols], rows


def scored_positions_packed(
    input_ids: torch.Tensor, segment_ids: torch.Tensor, candidate_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which hidden state predicts which response token, for the packed (B, L) layout.

    segment_ids (B, L): -1 padding, 0 prompt, i >= 1 the i-th response. A response's
    first token is predicted at the last prompt position, later tokens at the previous
    position (same segment). With an empty prompt the first token has no predictor
    and is not scored, as in the unshared layout.

    Returns flat source indices into (B * L), target ids, and flat candidate indices
    (row-major over the True entries of candidate_mask), all (M,).
    """
    b, l = segment_ids.shape
    prompt_len = (segment_ids == 0).sum(1)  # (B,)
    prev = torch.cat([segment_ids.new_full((b, 1), -2), segment_ids[:, :-1]], dim=1)  # (B, L)
    first = segment_ids != prev  # (B, L) first token of its segment
    is_response = segment_ids >= 1
    keep = is_response & ~(first & (prompt_len[:, None] == 0))
    rows, cols = keep.nonzero(as_tuple=True)  # (M,)
    src_col = torch.where(first[rows, cols], prompt_len[rows] - 1, cols - 1)
    offsets = candidate_mask.sum(1).cumsum(0) - candidate_mask.sum(1)  # (B,) first flat candidate of each row
    cand = offsets[rows] + segment_ids[rows, cols] - 1
    return rows * l + src_col, input_ids[rows, cols], cand


def response_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_LOGIT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed log-prob over its labelled tokens, and their count (unshared layout).

    Args:
        input_ids, attention_mask, labels: (N, T); labels are IGNORE_INDEX outside
            the response.
        chunk_size: label positions per output-embedding chunk.

    Returns:
        logp_sum (N,) float32 and lengths (N,) int64. Equal (to float32 rounding) to
        :func:`response_logps_reference`, without its (N, T, vocab) logits.
    """
    if not logits_are_plain(model):
        # asked every step: once per run is enough
        LOG.warning_once(
            "POFE: this model transforms its logits beyond lm_head; scoring falls back to full logits (more memory)"
        )
        return response_logps_reference(model, input_ids, attention_mask, labels)
    head, in_forward = scoring_head(model)
    hidden = final_hidden_states(model, in_forward, input_ids=input_ids, attention_mask=attention_mask)  # (N, T, H|V)
    src, tgt, row = scored_positions_unshared(labels)
    logps = token_logps(head, hidden.flatten(0, 1)[src], tgt, chunk_size)  # (M,)
    n = labels.shape[0]
    return sum_per_candidate(logps, row, n)


def sum_per_candidate(logps: torch.Tensor, candidate: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs (M,) summed per candidate index (M,) into (N,), and the token counts (N,)."""
    return logps.new_zeros(n).index_add(0, candidate, logps), torch.bincount(candidate, minlength=n)


def packed_response_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segment_ids: torch.Tensor,
    position_ids: torch.Tensor,
    candidate_mask: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_LOGIT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs and lengths of every candidate from the prefix-shared layout.

    Args:
        input_ids, attention_mask, segment_ids, position_ids: (B, L) packed rows.
        candidate_mask: (B, K) real candidates.

    Returns:
        logp_sum (N,) float32 and lengths (N,) int64, N = candidate_mask.sum(), in the
        row-major order of candidate_mask (the unshared layout's row order).
    """
    mask4d = block_attention_mask(segment_ids, attention_backend(model), mask_dtype(model))  # (B, 1, L, L)
    head, in_forward = scoring_head(model)
    hidden = final_hidden_states(
        model, in_forward, input_ids=input_ids, attention_mask=mask4d, position_ids=position_ids
    )  # (B, L, H|V)
    src, tgt, cand = scored_positions_packed(input_ids, segment_ids, candidate_mask)
    logps = token_logps(head, hidden.flatten(0, 1)[src], tgt, chunk_size)  # (M,)
    n = int(candidate_mask.sum())
    return sum_per_candidate(logps, cand, n)


def cache_response_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    segment_ids: torch.Tensor,
    position_ids: torch.Tensor,
    candidate_mask: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_LOGIT_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`packed_response_logps` through the prompts' KV cache (`pofe.prefix_cache`)."""
    head, in_forward = scoring_head(model)
    hidden, tgt, cand = cache_hidden_states(
        model, input_ids, segment_ids, position_ids, candidate_mask, logits=in_forward
    )  # (M, H|V)
    logps = token_logps(head, hidden, tgt, chunk_size)  # (M,)
    n = int(candidate_mask.sum())
    return sum_per_candidate(logps, cand, n)


def score_candidates(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    *,
    chunk_size: int = DEFAULT_LOGIT_CHUNK_SIZE,
    prefix_layout: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """logp_sum and lengths as (B, K) for a `KResponseCollator` batch of either layout.

    A prefix-shared batch runs in the layout `pofe.prefix.choose_layout` picks from
    `prefix_layout` (`pofe.prefix_layout`), the model's attention backend and the batch.
    Padded candidate slots hold 0 (the losses mask them with candidate_mask).
    """
    mask = inputs["candidate_mask"]  # (B, K)
    if "segment_ids" in inputs:
        segment_ids, position_ids = inputs["segment_ids"], inputs["position_ids"]
        grad = torch.is_grad_enabled() and model.training
        layout = choose_layout(
            prefix_layout,
            attention_backend(model),
            segment_ids,
            mask,
            reentrant=grad and reentrant_checkpointing(model),
        )
        LOG.debug(f"POFE: prefix layout {layout} for a batch of {tuple(segment_ids.shape)}")
        check_backend(model, position_ids, layout)
        if not logits_are_plain(model):
            raise ValueError("prefix sharing needs plain lm_head logits; set pofe.prefix_sharing: false")
        if layout == "cache":
            logp_sum, lengths = cache_response_logps(
                model, inputs["input_ids"], segment_ids, position_ids, mask, chunk_size=chunk_size
            )  # (N,)
        else:
            logp_sum, lengths = packed_response_logps(
                model,
                inputs["input_ids"],
                inputs["attention_mask"],
                segment_ids,
                position_ids,
                mask,
                chunk_size=chunk_size,
            )  # (N,)
    else:
        logp_sum, lengths = response_logps(
            model, inputs["input_ids"], inputs["attention_mask"], inputs["labels"], chunk_size=chunk_size
        )  # (N,)
    logp = logp_sum.new_zeros(mask.shape).masked_scatter(mask, logp_sum)  # (B, K)
    lens = lengths.new_zeros(mask.shape).masked_scatter(mask, lengths)  # (B, K)
    return logp, lens


def response_logps_reference(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive path: full (N, T, vocab) logits, then TRL's `selective_log_softmax`.

    Kept as the reference the fast paths are tested against, and as the fallback for
    models whose logits are not `lm_head(hidden)` (soft-capping, logit scales).
    """
    from trl.trainer.utils import selective_log_softmax  # importing trl costs seconds: only here

    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    targets = labels[:, 1:]  # (N, T-1): token t+1 is predicted at position t
    mask = targets != IGNORE_INDEX
    token_logps_ = selective_log_softmax(logits[:, :-1], targets.clamp(min=0))  # (N, T-1)
    token_logps_ = torch.where(mask, token_logps_.float(), 0.0)
    return token_logps_.sum(-1), mask.sum(-1)
