"""POFE step benchmark: prefix sharing + chunked scoring against the usual layouts.

    python -m benchmarks.run            # full CPU run (~10 min on 2 cores)
    python -m benchmarks.run --quick    # smoke run (< 1 min)
    benchmarks/gpu.sh                   # ~1B model, bf16, full FT and QLoRA, on CUDA

Every figure is a ratio of two variants run side by side in one process, on the same
model and the same synthetic batch, interleaved repetition by repetition (medians).
Variants, per training step (forward + loss + backward; batches are collated before
timing, as a dataloader worker would):

RRHF
  packed     prefix sharing, packed rows with a block mask, + chunked scoring
             (`pofe.scoring.score_candidates`, `pofe.prefix_layout: packed`)
  cache      prefix sharing through the prompt's KV cache (`pofe.prefix_layout: cache`)
  pofe       whichever of the two `pofe.prefix_layout: auto` picks for the workload on
             this backend (the ratios are POFE's as configured by default)
  reference  k full `prompt + response` rows per prompt, padded, full float32
             log_softmax over (N, T, vocab) then gather (the RRHF authors' train.py)
  sft        SFT over the same unique tokens: one causal row per prompt,
             `prompt r_1 ... r_k`, the model's own causal-LM loss on all positions
SPPO (hard labels, chosen/rejected pairs)
  packed, cache, pofe
             (prompt, chosen, rejected) shared as above + chunked scoring, anchor
             log-probs precomputed (the SPPO trainer's table), `sppo_hard_loss`
  trl        TRL DPOTrainer-style `sppo_hard`: chosen and rejected rows concatenated,
             policy forward + backward with full logits and `selective_log_softmax`,
             plus a live reference forward under no_grad (a frozen copy of the model;
             the adapter-disabled base under LoRA/QLoRA, as TRL does with peft)

Memory. CUDA: torch.cuda.max_memory_allocated() during the step minus the allocation
before it. CPU: the process's peak resident set during the step (VmHWM, reset through
/proc/self/clear_refs) minus its resident set before the step; the script re-executes
itself with MALLOC_MMAP_THRESHOLD_ fixed so freed tensors go back to the OS and the
figure tracks live tensor bytes (including parameter gradients, which every variant
allocates alike). Both measure extra memory of one step over the loaded model.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_"
if __name__ == "__main__" and MALLOC_ENV not in os.environ and "cuda" not in " ".join(sys.argv):
    # CPU memory is read from the resident set: fix glibc's mmap threshold so large
    # frees go back to the OS at once and RSS tracks live tensors. Re-exec before
    # importing torch (the variable is read at process start).
    os.environ[MALLOC_ENV] = "131072"
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.run", *sys.argv[1:]])

import torch  # noqa: E402

# ---------------------------------------------------------------- models
MODELS = {
    # the CPU model: hidden 256, 4 layers, vocab 32k
    "small": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    # TinyLlama-1.1B's shape
    "1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    # smoke tests of the GPU script on the CPU
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=1000,
    ),
}


def build_model(name: str, device: str, dtype: torch.dtype, mode: str, seed: int = 0, attn: str = "sdpa"):
    """Random-init Llama from a config; `qlora` saves it and reloads it in 4 bit with LoRA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **MODELS[name], max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation=attn
    )
    torch.manual_seed(seed)
    with torch.device(device):  # initialise in place (a 1B model on the CPU first is slow)
        model = LlamaForCausalLM(config).to(dtype)
    if mode == "full":
        return model.train()
    if mode != "qlora":
        raise ValueError(f"unknown mode {mode!r}")
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        quant = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True
        )
        model = LlamaForCausalLM.from_pretrained(
            tmp, quantization_config=quant, dtype=dtype, device_map={"": device}, attn_implementation=attn
        )
    # no prepare_model_for_kbit_training: it would upcast norms, embeddings and the head
    # to float32; the adapters stay float32 (peft's default), the rest runs in `dtype`
    lora = LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    return get_peft_model(model, lora).train()


# ---------------------------------------------------------------- workloads
@dataclass
class Workload:
    name: str
    method: str  # rrhf | sppo
    prompts: int  # per step
    k: int
    prompt_len: int
    response_len: int

    def unique_tokens(self) -> int:
        return self.prompts * (self.prompt_len + self.k * self.response_len)


def workloads(quick: bool) -> list[Workload]:
    if quick:
        return [  # the same shapes, scaled down (the ratios come out lower than the full run's)
            Workload("paper", "rrhf", 1, 6, 16, 32),
            Workload("long-prompt", "rrhf", 1, 8, 128, 32),
            Workload("sppo-pairs", "sppo", 1, 2, 64, 32),
        ]
    return [
        # RRHF paper: k = 6 candidates, 192 tokens per candidate row (prompt 64 + response 128)
        Workload("paper", "rrhf", 2, 6, 64, 128),
        Workload("long-prompt", "rrhf", 1, 8, 512, 128),
        # SPPO hard labels on chosen/rejected pairs
        Workload("sppo-pairs", "sppo", 2, 2, 256, 128),
    ]


class _Tok:
    pad_token_id = 0
    eos_token_id = 0


def make_batches(w: Workload, vocab: int, device: str, seed: int = 0) -> dict[str, dict]:
    """The same synthetic prompts and candidates in every layout the variants use."""
    from pofe.collator import KResponseCollator

    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    feats = []
    for _ in range(w.prompts):
        feats.append(
            {
                "prompt_ids": rand(w.prompt_len),
                "response_ids": [rand(w.response_len) for _ in range(w.k)],
                "rewards": torch.randn(w.k, generator=g).tolist(),
            }
        )
    shared = KResponseCollator(_Tok(), prefix_sharing=True)(feats)
    unshared = KResponseCollator(_Tok())(feats)
    sft_ids = torch.tensor([f["prompt_ids"] + sum(f["response_ids"], []) for f in feats])
    sft = {"input_ids": sft_ids, "labels": sft_ids.clone()}
    move = lambda b: {k: v.to(device) for k, v in b.items()}  # noqa: E731
    return {"shared": move(shared), "unshared": move(unshared), "sft": move(sft)}


# ---------------------------------------------------------------- steps
def rrhf_pofe(model, batch, chunk, layout):
    from pofe.losses import rrhf_loss
    from pofe.scoring import score_candidates

    logp, lengths = score_candidates(model, batch, chunk_size=chunk, prefix_layout=layout)  # (B, K)
    loss, _ = rrhf_loss(logp, lengths, batch["rewards"], mask=batch["candidate_mask"])
    loss.backward()


def full_logsoftmax_logps(model, batch):
    """The RRHF authors' scoring: full float32 log_softmax over (N, T, vocab), then gather."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    logps = torch.log_softmax(logits.float(), dim=-1)[:, :-1]  # (N, T-1, V)
    targets = batch["labels"][:, 1:]
    mask = targets != -100
    token = logps.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)  # (N, T-1)
    return torch.where(mask, token, 0.0).sum(-1), mask.sum(-1)  # (N,)


def rrhf_reference(model, batch, chunk):
    from pofe.losses import rrhf_loss

    logp, lengths = full_logsoftmax_logps(model, batch)
    mask = batch["candidate_mask"]
    logp = logp.new_zeros(mask.shape).masked_scatter(mask, logp)  # (B, K)
    lengths = lengths.new_zeros(mask.shape).masked_scatter(mask, lengths)
    loss, _ = rrhf_loss(logp, lengths, batch["rewards"], mask=mask)
    loss.backward()


def sft_step(model, batch, chunk):
    model(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False).loss.backward()


def sppo_pofe(model, batch, chunk, layout):
    from pofe.losses import sppo_hard_loss
    from pofe.scoring import score_candidates

    logp, _ = score_candidates(model, batch, chunk_size=chunk, prefix_layout=layout)  # (B, 2)
    anchor = batch["anchor"]  # (B, 2) precomputed once before training
    loss, _ = sppo_hard_loss(logp[:, 0], anchor[:, 0], logp[:, 1], anchor[:, 1], beta=1e-3)
    loss.backward()


def trl_logps(model, batch):
    """TRL's concatenated forward: full logits, then selective_log_softmax."""
    from pofe.scoring import response_logps_reference

    return response_logps_reference(model, batch["input_ids"], batch["attention_mask"], batch["labels"])[0]


def sppo_trl(model, batch, chunk, reference):
    from pofe.losses import sppo_hard_loss

    logp = trl_logps(model, batch).view(-1, 2)  # rows are chosen, rejected per prompt
    with torch.no_grad():
        if reference is None:  # peft: the base model with the adapter disabled
            with model.disable_adapter():
                ref = trl_logps(model, batch).view(-1, 2)
        else:
            ref = trl_logps(reference, batch).view(-1, 2)
    loss, _ = sppo_hard_loss(logp[:, 0], ref[:, 0], logp[:, 1], ref[:, 1], beta=1e-3)
    loss.backward()


# ---------------------------------------------------------------- measuring
def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(fn, model, device: str) -> tuple[float, float]:
    """(seconds, extra peak MiB) of one step; gradients are freed before and after."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _rss_kb("VmRSS:") * 1024
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = max(0, _rss_kb("VmHWM:") * 1024 - base)  # RSS can shrink during a tiny step
    model.zero_grad(set_to_none=True)
    return seconds, peak / 2**20


def _ratio(a: float, b: float) -> float:
    """a / b, NaN when b is not positive (tiny CPU runs sit below what RSS resolves)."""
    return a / b if b > 0 else float("nan")


def bench(workload: Workload, model, device: str, reps: int, chunk: int, reference=None) -> dict:
    from pofe.modeling import attention_backend
    from pofe.prefix import MASK_BACKENDS, choose_layout

    vocab = model.config.vocab_size
    batches = make_batches(workload, vocab, device)
    shared = batches["shared"]
    backend = attention_backend(model)
    layouts = [x for x in ("packed", "cache") if x == "cache" or backend in MASK_BACKENDS]
    auto = choose_layout("auto", backend, shared["segment_ids"], shared["candidate_mask"])
    if workload.method == "rrhf":
        variants = {x: (lambda x=x: rrhf_pofe(model, shared, chunk, x)) for x in layouts}
        variants["reference"] = lambda: rrhf_reference(model, batches["unshared"], chunk)
        variants["sft"] = lambda: sft_step(model, batches["sft"], chunk)
    else:
        from pofe.scoring import score_candidates

        with torch.no_grad():  # what the SPPO trainer's anchor table holds
            shared["anchor"] = score_candidates(model, shared, chunk_size=chunk)[0].detach()
        variants = {x: (lambda x=x: sppo_pofe(model, shared, chunk, x)) for x in layouts}
        variants["trl"] = lambda: sppo_trl(model, batches["unshared"], chunk, reference)
    times = {name: [] for name in variants}
    memory = {}
    for name, fn in variants.items():  # warm-up, then a memory-only step
        measure(fn, model, device)
        memory[name] = measure(fn, model, device)[1]
    names = list(variants)
    for rep in range(reps):  # interleaved, the order rotating, so drift hits every variant alike
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            times[name].append(measure(variants[name], model, device)[0])
    median = {name: statistics.median(t) for name, t in times.items()}
    median["pofe"], memory["pofe"] = median[auto], memory[auto]  # what `auto` runs
    tokens = workload.unique_tokens()
    result = {
        "workload": asdict(workload),
        "attn": backend,
        "auto_layout": auto,
        "seconds_median": median,
        "seconds_all": times,
        "peak_extra_mib": memory,
        "unique_tokens_per_step": tokens,
        "tokens_per_second": {name: tokens / s for name, s in median.items()},
    }
    base = "reference" if workload.method == "rrhf" else "trl"
    result["ratios"] = {
        f"speedup_vs_{base}": _ratio(median[base], median["pofe"]),
        f"memory_vs_{base}": _ratio(memory["pofe"], memory[base]),
    }
    if "sft" in median:
        result["ratios"]["time_vs_sft"] = _ratio(median["pofe"], median["sft"])
        result["ratios"]["memory_vs_sft"] = _ratio(memory["pofe"], memory["sft"])
    for x in layouts:  # each layout on its own, so the auto rule can be checked against both
        result["ratios"][f"{x}_speedup_vs_{base}"] = _ratio(median[base], median[x])
    return result


TARGETS = {  # issue 12's (the memory ones from the first benchmark's issue)
    ("long-prompt", "speedup_vs_reference"): (">=", 4.5),
    ("long-prompt", "time_vs_sft"): ("<=", 1.0),
    ("long-prompt", "memory_vs_reference"): ("<=", 0.4),
    ("paper", "speedup_vs_reference"): (">=", 1.4),
    ("paper", "memory_vs_reference"): ("<=", 0.4),
    ("sppo-pairs", "speedup_vs_trl"): (">=", 1.25),
}


def table(results: list[dict], label: str) -> str:
    lines = [f"## {label}", f"{'workload':<12} {'ratio':<28} {'value':>7}  target", "-" * 58]
    for r in results:
        name = r["workload"]["name"]
        lines.append(f"{name:<12} {'auto layout (pofe)':<28} {r['auto_layout']:>7}")
        for key, value in r["ratios"].items():
            op, goal = TARGETS.get((name, key), ("", None))
            if value != value:  # NaN
                target = "n/a (too small to measure)"
            elif goal is None:
                target = ""
            else:
                target = f"{op} {goal:<5} {'met' if (value >= goal if op == '>=' else value <= goal) else 'MISSED'}"
            lines.append(f"{name:<12} {key:<28} {value:7.2f}  {target}")
    lines.append("")
    lines.append(f"{'workload':<12} {'variant':<10} {'s/step':>8} {'tok/s':>9} {'peak MiB':>9}")
    for r in results:
        for v, s in r["seconds_median"].items():
            lines.append(
                f"{r['workload']['name']:<12} {v:<10} {s:8.3f} {r['tokens_per_second'][v]:9.0f} "
                f"{r['peak_extra_mib'][v]:9.1f}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small workloads, 2 repetitions (< 1 min)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per variant (default 5, quick 2)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "bf16"])
    parser.add_argument("--modes", default="full", help="comma list of full, qlora")
    parser.add_argument(
        "--attn", default="sdpa", help="attn_implementation: eager, sdpa, flash_attention_2, flex_attention, ..."
    )
    parser.add_argument("--chunk", type=int, default=1024, help="pofe.logit_chunk_size")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: 1 with --quick, else torch's default)"
    )
    parser.add_argument("--workloads", default=None, help="comma list of workload names to run")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<model>-<device>.json)")
    args = parser.parse_args(argv)

    if not args.device.startswith("cuda") and MALLOC_ENV not in os.environ:
        print(f"warning: {MALLOC_ENV} unset, CPU memory figures include freed-but-cached heap", file=sys.stderr)
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    dtype = torch.bfloat16 if args.dtype in ("bf16", "bfloat16") else torch.float32
    reps = args.reps or (2 if args.quick else 5)
    chosen = workloads(args.quick)
    if args.workloads:
        chosen = [w for w in chosen if w.name in args.workloads.split(",")]

    report = {
        "device": args.device,
        "model": args.model,
        "model_config": MODELS[args.model],
        "dtype": str(dtype),
        "attn": args.attn,
        "threads": torch.get_num_threads(),
        "reps": reps,
        "chunk": args.chunk,
        "torch": torch.__version__,
        "runs": {},
    }
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    text = []
    for mode in args.modes.split(","):
        model = build_model(args.model, args.device, dtype, mode, attn=args.attn)
        reference = None
        if mode == "full":  # TRL's live reference: a frozen copy (peft models disable the adapter instead)
            reference = copy.deepcopy(model).eval().requires_grad_(False)
        results = []
        for w in chosen:
            t0 = time.time()
            results.append(bench(w, model, args.device, reps, args.chunk, reference if w.method == "sppo" else None))
            print(f"[{mode}] {w.name}: {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
        report["runs"][mode] = results
        text.append(table(results, f"{args.model} / {mode} / {dtype} / {args.attn} / {args.device}"))
        del model, reference
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    out = Path(
        args.out
        or Path(__file__).parent
        / "results"
        / f"{args.model}-{args.device.split(':')[0]}{'-quick' if args.quick else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print("\n\n".join(text))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
