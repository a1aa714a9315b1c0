"""Prefix sharing equals the unshared layout on sdpa, flash-attention-2 and FlexAttention, and
what it saves in time there; chunked scoring's memory against unchunked.

The RRHF scores of a batch of k-response rows (`pofe.scoring.score_candidates`) and the
gradients of a weighted sum of them, once unshared (k full rows per prompt) and once shared
(the prompt's KV cache on every backend; packed rows with a block mask too on sdpa, the only
one of the three that takes a 4D mask), as tests/test_prefix_sharing.py checks on the CPU.

Tolerance. float32 (the CPU): `tests.helpers.float_tolerance`, rtol = 4 eps sqrt(n), n = width x
unshared tokens, as in the tests. bf16 (the GPU): that bound exceeds 1 at this width, so it
proves nothing; instead each layout is compared with the unshared layout run in float32, and
prefix sharing passes when its largest deviation (values, and every gradient relative to its
tensor's largest entry) is at most 2x the unshared bf16 layout's own: sharing adds no error
beyond bf16's. The float32 reference runs sdpa (flash-attn takes no float32): the exact
attention, whichever kernel computes it. FlexAttention and flash-attention-2 have no CPU backward: `needs GPU` there.

Speed (`measured`): one step (scores, then the backward of their weighted sum) on a long-prompt
batch (`TIMING`: k = 8 responses of 128 tokens after a 512-token prompt on the GPU), unshared
against each shared layout, on the same model, warmed up (FlexAttention compiles), repetitions
interleaved, medians. Memory (`measured` on CUDA; the CPU's resident set cannot resolve it): the
same step's peak over the loaded model with `pofe.logit_chunk_size` 1024 against one chunk of
every response position (unchunked: the whole (positions, vocab) float32 logits kept for backward).
"""

from __future__ import annotations

import statistics

import torch

BACKENDS = ("sdpa", "flash_attention_2", "flex_attention")
BF16_FACTOR = 2.0
# the timing batch (prompts, k, prompt and response tokens): the GPU's, and the CPU's tiny one
TIMING = {
    True: dict(prompts=4, k=8, prompt_len=512, response_len=128),
    False: dict(prompts=2, k=4, prompt_len=64, response_len=16),
}
REPS = 5
CHUNK = 1024  # pofe.logit_chunk_size's default


def features(
    seed: int = 0, prompts: int = 4, k: int = 4, prompt_len: int = 48, response_len: int = 24, vocab: int = 32000
) -> list[dict]:
    """Random rows of varied lengths (ids above the special tokens)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(10, vocab, (n,), generator=g).tolist()  # noqa: E731
    lengths = lambda n: int(torch.randint(n // 2, n + 1, (1,), generator=g))  # noqa: E731
    return [
        {
            "prompt_ids": rand(lengths(prompt_len)),
            "response_ids": [rand(lengths(response_len)) for _ in range(k)],
            "rewards": torch.randn(k, generator=g).tolist(),
        }
        for _ in range(prompts)
    ]


def step(model, batch, layout: str | None, chunk: int = 64):
    """Scores of `batch` (unshared when `layout` is None) and the backward of sum(weights * scores)."""
    from pofe.scoring import score_candidates

    kwargs = {} if layout is None else {"prefix_layout": layout}
    value = score_candidates(model, batch, chunk_size=chunk, **kwargs)[0]
    weights = torch.linspace(0.5, 1.5, value.numel(), device=value.device).view_as(value)
    (weights * value).float().sum().backward()
    return value


def value_and_grads(model, batch, layout: str | None):
    """Scores of `batch` and the gradients of sum(weights * scores) w.r.t. every parameter."""
    model.zero_grad(set_to_none=True)
    value = step(model, batch, layout)
    return value.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def timed(model, batches, layouts, cuda: bool) -> dict:
    """Median seconds of a step per variant (`unshared`, then each shared layout), and the peaks of
    the first shared layout's step with chunks of CHUNK and unchunked (`benchmarks.run.measure`)."""
    from benchmarks.run import measure

    unshared, shared = batches
    device = "cuda" if cuda else "cpu"
    variants = {"unshared": lambda: step(model, unshared, None, CHUNK)}
    variants |= {x: (lambda x=x: step(model, shared, x, CHUNK)) for x in layouts}
    for fn in variants.values():  # warm-up: kernels chosen, FlexAttention compiled
        measure(fn, model, device)
    times = {name: [] for name in variants}
    for rep in range(REPS):  # interleaved, the order rotating
        for name in list(variants)[rep % len(variants) :] + list(variants)[: rep % len(variants)]:
            times[name].append(measure(variants[name], model, device)[0])
    peaks = {
        f"chunk {CHUNK}": measure(lambda: step(model, shared, layouts[0], CHUNK), model, device)[1],
        "unchunked": measure(lambda: step(model, shared, layouts[0], 2**62), model, device)[1],  # one chunk
    }
    shape = TIMING[cuda]
    return {
        "seconds": {n: statistics.median(t) for n, t in times.items()},
        "peak_extra_mib": peaks,
        "positions": shape["prompts"] * shape["k"] * shape["response_len"],  # the response tokens scored
        "vocab": model.config.vocab_size,
    }


def deviation(a, b) -> float:
    """Largest |a - b| of the values and of each gradient, relative to b's largest entry."""
    (va, ga), (vb, gb) = a, b
    gaps = [((va - vb).abs().max() / vb.abs().max().clamp_min(1e-30)).item()]
    gaps += [((ga[n] - gb[n]).abs().max() / gb[n].abs().max().clamp_min(1e-30)).item() for n in gb]
    return max(gaps)


def within_float_tolerance(a, b, n_terms: int) -> bool:
    from tests.helpers import float_tolerance

    (va, ga), (vb, gb) = a, b
    pairs = [(va, vb)] + [(ga[n], gb[n]) for n in gb]
    return ga.keys() == gb.keys() and all(
        torch.allclose(x, y, **float_tolerance(torch.float32, n_terms, y.abs().max().item())) for x, y in pairs
    )


def load(model_dir, attn: str, dtype, device: str):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(
        model_dir, attn_implementation=attn, dtype=dtype, device_map={"": device}
    ).train()


def check_backend(model_dir, feats, batches, timing_batches, attn: str, reference) -> list[dict]:
    """The rows for one backend: each shared layout against the unshared one, in numbers and in
    time. `reference`: the unshared layout in float32 (GPU), or None (CPU, float32 throughout)."""
    from benchmarks.gpu_check.report import row

    cuda = reference is not None
    unshared, shared = batches
    model = load(model_dir, attn, torch.bfloat16 if cuda else torch.float32, "cuda" if cuda else "cpu")
    base = value_and_grads(model, unshared, None)
    layouts = ("packed", "cache") if attn == "sdpa" else ("cache",)
    runs = {layout: value_and_grads(model, shared, layout) for layout in layouts}
    model.zero_grad(set_to_none=True)
    try:
        speed = timed(model, timing_batches, layouts, cuda)
    except Exception as err:  # noqa: BLE001 - the numbers above stand; the timing's failure is its own row
        speed = err
    width = model.config.hidden_size
    del model
    if cuda:
        torch.cuda.empty_cache()
    n = width * sum(len(f["prompt_ids"]) * len(f["response_ids"]) + sum(map(len, f["response_ids"])) for f in feats)
    rows = [equality_row(attn, layout, got, base, reference, n) for layout, got in runs.items()]
    if isinstance(speed, Exception):
        return rows + [row(f"prefix speed {attn}", "FAIL", f"{type(speed).__name__}: {speed}"[:300])]
    return rows + speed_rows(attn, speed, cuda)


def equality_row(attn: str, layout: str, got, base, reference, n: int) -> dict:
    """bf16 (GPU): against the unshared layout in float32, within 2x the unshared bf16 layout's own
    deviation; float32 (CPU): within float32 rounding of sums of `n` terms."""
    from benchmarks.gpu_check.report import row

    name = f"prefix sharing {attn} {layout}"
    if reference is not None:
        dev, own = deviation(got, reference), deviation(base, reference)
        return row(
            name,
            "pass" if dev <= BF16_FACTOR * own else "FAIL",
            f"bf16 deviation from float32 {dev:.2e}, unshared bf16's own {own:.2e} (<= {BF16_FACTOR}x)",
            deviation=dev,
            unshared_deviation=own,
        )
    return row(
        name,
        "pass" if within_float_tolerance(got, base, n) else "FAIL",
        f"float32, largest relative gap {deviation(got, base):.2e} (rtol 4 eps sqrt({n}))",
        deviation=deviation(got, base),
    )


def speed_rows(attn: str, speed: dict, cuda: bool) -> list[dict]:
    """Unshared over shared step time per layout; on sdpa, chunked against unchunked memory."""
    from benchmarks.gpu_check.report import row

    t = speed["seconds"]
    shape = TIMING[cuda]
    ratios = {x: t["unshared"] / t[x] for x in t if x != "unshared"}
    rows = [
        row(
            f"prefix speed {attn}",
            "measured",
            f"{shape['prompts']} prompts x k={shape['k']}, {shape['prompt_len']}+{shape['response_len']} tokens: "
            f"unshared {t['unshared'] * 1e3:.1f} ms/step, "
            + ", ".join(f"{x} {t[x] * 1e3:.1f} ms (speedup {r:.2f}x)" for x, r in ratios.items()),
            seconds=t,
            speedup=ratios,
        )
    ]
    if attn == "sdpa":
        peaks = speed["peak_extra_mib"]
        chunked, whole = peaks[f"chunk {CHUNK}"], peaks["unchunked"]
        logits_mib = speed["positions"] * speed["vocab"] * 4 / 2**20
        rows.append(
            row(
                "chunked logits memory",
                "measured" if cuda else "needs GPU",
                f"step peak over the model: chunks of {CHUNK} {chunked:,.0f} MiB, unchunked {whole:,.0f} MiB "
                f"({f'{chunked / whole:.2f}x' if whole > 0 else 'n/a'}; the {speed['positions']} positions' float32 "
                f"logits are {logits_mib:,.0f} MiB)" + ("" if cuda else "; the CPU's resident set cannot resolve it"),
                peak_extra_mib=peaks,
            )
        )
    return rows


def available(attn: str, cuda: bool) -> str | None:
    """Why `attn` cannot run here, or None."""
    if attn != "sdpa" and not cuda:
        return "needs GPU"  # flash-attn is CUDA only; FlexAttention has no backward on the CPU
    if attn == "flash_attention_2":
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            return "skipped: flash_attn not installed (pip install flash-attn)"
    return None


def checks(model_dir, tokenizer, cuda: bool) -> list[dict]:
    from benchmarks.gpu_check.report import row
    from benchmarks.run import Workload, make_batches
    from pofe.collator import KResponseCollator

    device = "cuda" if cuda else "cpu"
    feats = features(vocab=len(tokenizer))
    to = lambda b: {k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()}  # noqa: E731
    batches = (to(KResponseCollator(tokenizer)(feats)), to(KResponseCollator(tokenizer, prefix_sharing=True)(feats)))
    timing = make_batches(Workload("timing", "rrhf", **TIMING[cuda]), len(tokenizer), device)
    timing_batches = (timing["unshared"], timing["shared"])
    reference = None
    if cuda:  # the unshared layout in float32 (sdpa: flash-attn takes no float32), once for every backend
        model = load(model_dir, "sdpa", torch.float32, device)
        reference = value_and_grads(model, batches[0], None)
        del model
    rows = []
    for attn in BACKENDS:
        why = available(attn, cuda)
        if why:
            rows.append(row(f"prefix sharing {attn}", why))
            continue
        try:
            rows += check_backend(model_dir, feats, batches, timing_batches, attn, reference)
        except Exception as err:  # noqa: BLE001 - one backend's failure is its row; the others still run
            rows.append(row(f"prefix sharing {attn}", "FAIL", f"{type(err).__name__}: {err}"[:300]))
    return rows
