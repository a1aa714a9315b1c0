"""Helpers for tests that run the real `axolotl` CLI on CPU recipes."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml
from axolotl.cli.config import prepare_plugins
from axolotl.utils.config import validate_config
from axolotl.utils.dict import DictDefault

from pofe.args import pofe_config
from pofe.demo.task import answer, make_prompt_rows, make_prompts, write_jsonl
from pofe.run.folder import RunFolder, RunState
from pofe.run.rounds.runner import StageRunner

# the repository, whatever folder a test module sits in
ROOT = Path(__file__).resolve().parents[1]

# axolotl runs offline, on the CPU, without telemetry.
AXOLOTL_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "WANDB_MODE": "disabled",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# `tests.*` modules (the judges a test's recipe names) importable by an `axolotl` subprocess, ahead
# of any path already set (a checkout tested beside another's editable install keeps its own code)
TESTS_ON_PATH = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}

# Keys every CPU recipe needs (see docs in recipes/tiny-*-cpu.yml).
CPU_SETTINGS = {
    "bf16": False,
    "fp16": False,
    "tf32": False,
    "attn_implementation": "eager",
    "sample_packing": False,
    "optimizer": "adamw_torch",
    "dataloader_num_workers": 0,
    "lora_mlp_kernel": False,
    "lora_qkv_kernel": False,
    "lora_o_kernel": False,
    "lora_embedding_kernel": False,
}


def recipe(tmp_path: Path, model: Path, method: str, data: Path, dtype: str, **overrides) -> Path:
    """Write a CPU recipe for `method` on `data`; returns its path."""
    cfg = {
        "base_model": str(model),
        "plugins": ["pofe.PofePlugin"],
        "rl": method,
        "datasets": [{"path": str(data), "type": dtype}],
        "dataset_prepared_path": str(tmp_path / "prepared"),
        "output_dir": str(tmp_path / "out"),
        "sequence_len": 64,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "num_epochs": 1,
        "learning_rate": 3e-3,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "logging_steps": 1,
        "save_strategy": "epoch",
        "seed": 0,
        **CPU_SETTINGS,
        **overrides,
    }
    path = tmp_path / "recipe.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_axolotl(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real `axolotl` CLI of this environment (in-process launcher: 2 CPUs); `env`
    is added to its environment."""
    axolotl = Path(sys.executable).parent / "axolotl"
    extra = ["--launcher", "python"] if args[0] == "train" else []
    env = {**os.environ, **AXOLOTL_ENV, **(env or {})}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [str(axolotl), *args, *extra],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"axolotl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return proc


def log_history(output_dir: Path) -> list[dict]:
    """The Trainer's log history from the last checkpoint's trainer_state.json."""
    states = sorted(
        output_dir.glob("checkpoint-*/trainer_state.json"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    assert states, f"no checkpoint with trainer_state.json under {output_dir}"
    return json.loads(states[-1].read_text())["log_history"]


def load_llama(path: Path, attn: str = "eager"):
    """A tiny Llama in float32 and train mode (dropout is 0: train mode exercises autograd)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, attn_implementation=attn, dtype=torch.float32)
    return model.train()


def float_tolerance(dtype, n_terms: int, magnitude: float = 1.0, c: float = 4.0) -> dict[str, float]:
    """`rtol`/`atol` for two computations of one float quantity that differ in the order of
    their sums (prefix-shared vs unshared, chunked vs whole, KV cache vs packed, FSDP vs one
    process), as `torch.testing.assert_close` takes them.

    Each rounding of a sum of `n_terms` terms of size about `magnitude` errs by up to
    eps / 2 times the partial sum, eps = `torch.finfo(dtype).eps` (float32: 1.19e-7,
    bfloat16: 7.8e-3). Taken as independent, the errors add up like a random walk, to about
    eps * sqrt(n) * magnitude; all in one direction (the worst case) they reach
    eps * n * magnitude. Two orders of the same sum differ by about as much. A value or
    gradient of a small transformer sums over the width H at each matmul and, for a
    weight's gradient, over every token of the batch, so n ~ H * tokens; the few matmuls in
    series add a constant factor, `c`.

    Returns rtol = c * eps * sqrt(n) and atol = rtol * magnitude (the scale of the whole
    tensor, for its elements near zero). Measured on the 64-wide tiny model (130 tokens,
    n = 8320, bound 365 eps * max|ref| at c = 4): the worst of tests/test_prefix_sharing.py
    and tests/test_scoring.py differed by 12 eps * max|ref| on AVX-512 (with and without
    ATEN_CPU_CAPABILITY=avx2/default); the CI failure that the old fixed 1e-5 met (1.3e-5
    on a LoRA gradient of max 1.46) is ~75 eps * max|ref|, still 5x inside. The bound stays
    far below what a bug moves: a token scored at a rotary position off by one, or one
    token of a batch dropped, misses it by 1e2-1e4 times.
    """
    import torch

    eps = torch.finfo(dtype).eps
    rtol = c * eps * math.sqrt(n_terms)
    return {"rtol": rtol, "atol": rtol * float(magnitude)}


def approx_float(expected: float, n_terms: int, scale: float = 1.0):
    """`pytest.approx` for a float32 scalar computed two ways (batched and padded vs alone, a
    judge vs a hand-written forward): `float_tolerance(float32, n_terms, scale)`. `scale` is
    the size of the terms summed last: 1 for a score read off layer-normed hidden states
    (O(1) entries), |expected| for a sum of log-probs."""
    import pytest
    import torch

    tol = float_tolerance(torch.float32, n_terms, scale)
    return pytest.approx(expected, rel=tol["rtol"], abs=tol["atol"])


def assert_float_close(actual, expected, n_terms: int, msg=None, **kwargs) -> None:
    """`torch.testing.assert_close` at `float_tolerance(expected.dtype, n_terms, max|expected|)`;
    non-finite entries (NaN for an unwritten slot) must match."""
    import torch

    finite = expected[expected.isfinite()]
    magnitude = finite.abs().max().item() if finite.numel() else 0.0
    tol = float_tolerance(expected.dtype, n_terms, magnitude)
    torch.testing.assert_close(actual, expected, **tol, equal_nan=True, msg=msg, **kwargs)


def prompts_stage(tmp_path: Path, method: str, pool: Path, pofe: dict) -> tuple:
    """An iterated run's prompts stage (`prepare_prompts`) on the `pofe.prompts` file `pool`
    with the `pofe:` block `pofe`, in tmp_path/run: (folder, state, the lines it echoed)."""
    from axolotl.utils.dict import DictDefault

    from pofe.run.rounds.loop import prepare_prompts

    cfg = DictDefault(
        {"rl": method, "datasets": [DictDefault({"path": str(pool), "type": "pofe.prompts"})], "pofe": pofe}
    )
    folder = RunFolder(tmp_path / "run")
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method=method)
    said: list[str] = []
    prepare_prompts(cfg, pofe_config(cfg), folder, StageRunner(state, echo=said.append))
    return folder, state, said


def prompts_in(path: Path) -> list:
    """The `prompt` of each row of a JSONL prompt file."""
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines()]


def read_wandb_history(run_dir: Path) -> tuple[dict, dict[int, dict], bool]:
    """The run record, {step: {key: value}} and whether the run's exit record is written, of
    an offline W&B run, read from its .wandb file: 7-byte file header, then 32 KiB blocks of
    records (crc32, length, type: 1 full, 2 first, 3 middle, 4 last), each a `Record` protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, run, history, exited = 7, 32768, b"", {}, {}, False
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.HasField("run"):
                run = {"name": record.run.display_name, "group": record.run.run_group, "id": record.run.run_id}
            exited = exited or record.HasField("exit")
            if record.HasField("history"):
                # "a/b" keys come as nested_key ["a", "b"]; "_step", "_runtime"... are wandb's own
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return run, history, exited


# `write_rounds_recipe`: the prompt pool and the held-out slice its eval keys set
NUM_PROMPTS, HELD_OUT = 14, 4
# the SPPO run sets no eval keys: the default slice, 5 % of 14 is under 16, a fifth of 14 is 2
DEFAULT_HELD_OUT = 2


def write_rounds_recipe(root: Path, model: Path, method: str, eval_keys: bool = True, **extra) -> Path:
    rows = make_prompt_rows(NUM_PROMPTS, k_wrong=2, seed=1)
    for r in rows:
        r["reference"] = r["answer"]  # held-out perplexity needs a reference response
    write_jsonl(rows, root / "prompts.jsonl")
    cfg = {
        "base_model": str(model),
        "plugins": ["pofe.PofePlugin"],
        "rl": method,
        "datasets": [{"path": str(root / "prompts.jsonl"), "type": "pofe.prompts"}],
        "dataset_prepared_path": str(root / "prepared"),
        "output_dir": str(root / "run"),
        "sequence_len": 64,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "num_epochs": 2,
        "learning_rate": 3e-3,
        "lr_scheduler": "constant",
        "warmup_steps": 0,
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": 0,
        **CPU_SETTINGS,
        "pofe": {
            "rounds": 2,
            "generate": {
                "backend": "transformers",
                "num_candidates": 3,
                "temperature": 1.0,
                "max_new_tokens": 4,
                "seed": 0,
                "include_dataset_responses": ["answer", "near_misses"],
            },
            "judge": {"type": "python", "function": "pofe.demo.task:reward"},
            **(
                {"eval": {"held_out": HELD_OUT, "num_samples": 2, "max_new_tokens": 4, "train_prompts": 3}}
                if eval_keys
                else {}
            ),
            **({"eta": 10.0} if method == "sppo" else {}),
        },
        **extra,
    }
    path = root / "recipe.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_state(run: Path) -> dict:
    return json.loads((run / "pofe-run.json").read_text())


def features(seed=0, prompt_lens=(5, 9, 3, 12), k_lens=((3, 7, 1), (4, 2), (6, 6, 2, 5), (2, 8, 3))):
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(7, 100, (n,), generator=g).tolist()  # noqa: E731
    rows = []
    for p, lens in zip(prompt_lens, k_lens):
        rewards = torch.randn(len(lens), generator=g).tolist()
        rows.append({"prompt_ids": rand(p), "response_ids": [rand(n) for n in lens], "rewards": rewards})
    return rows


def n_terms(feats) -> int:
    """Terms in the sums behind a value or a weight's gradient: width x the batch's unshared
    tokens (every candidate with its prompt), the larger of the two layouts."""
    tokens = sum(len(f["prompt_ids"]) * len(f["response_ids"]) + sum(map(len, f["response_ids"])) for f in feats)
    return HIDDEN * tokens


WORLD = 2


TIMEOUT_S = 600  # spawning imports torch, transformers and axolotl in each worker


def spawn_ranks(worker, out, *args) -> list:
    """Run `worker(rank, store, *args)` on WORLD spawned processes; what each saved to out/rank<r>.pt.

    A worker that hangs in a collective (unpaired calls across ranks) fails the test
    after TIMEOUT_S instead of blocking the suite.
    """
    context = mp.spawn(worker, args=(str(out / "store"), *args), nprocs=WORLD, join=False)
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=1):  # raises with the worker's traceback if one fails
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{WORLD} gloo workers did not finish within {TIMEOUT_S} s")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


H100 = {"bf16": True, "fp8": False, "tf32": True, "n_gpu": 1, "compute_capability": "sm_90"}
CPU = {"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}


def validated_recipe(raw: dict, caps=H100):
    cfg = DictDefault(raw)
    prepare_plugins(cfg)
    return validate_config(cfg, capabilities=caps, env_capabilities={"torch_version": "2.13.0"})


def prompts_file(tmp_path):
    rows = [{"prompt": p, "answer": str(answer(p))} for p in make_prompts(12, seed=3)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def pofe_block(method):
    return {
        # the dataset's reference answer joins the sampled candidates, as in the RRHF paper
        "generate": {
            "backend": "transformers",
            "num_candidates": 3,
            "temperature": 1.0,
            "max_new_tokens": 4,
            "seed": 0,
            "include_dataset_responses": ["answer"],
        },
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
        **({"eta": 10.0} if method == "sppo" else {}),
    }


HIDDEN = 64  # tiny64_model's width


# an iterated SPPO run's recipe, for the tests that derive its rounds without training
ITERATED_RAW = {
    "base_model": "/m/base",
    "lora_model_dir": "/m/adapter",
    "rl": "sppo",
    "datasets": [{"path": "data/p.jsonl", "type": "pofe.prompts", "field_prompt": "q", "split": "train"}],
    "output_dir": "/runs/x",
    "dataset_prepared_path": "/prep",
    "save_strategy": "no",
    "pofe": {
        "rounds": 3,
        "eval": {"held_out": 4},
        "generate": {"backend": "transformers", "seed": 7},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    },
}


@torch.no_grad()
def naive_logps(model, rows) -> torch.Tensor:
    """(num_rows, K_max) summed log-probs of each response under `model`, NaN where a row has
    no candidate, indexed by `row_id`: for each response alone, one full forward of its prompt
    and response ids and a whole log-softmax; no prefix sharing, no chunking, no batching
    (independent of `pofe.scoring`). `rows`: tokenised rows (row_id, prompt_ids, response_ids)."""
    rows = list(rows)
    table = torch.full((1 + max(r["row_id"] for r in rows), max(len(r["response_ids"]) for r in rows)), float("nan"))
    for row in rows:
        for k, response in enumerate(row["response_ids"]):
            ids = torch.tensor([row["prompt_ids"] + response])
            logp = model(ids).logits[0, :-1].float().log_softmax(-1)  # (T - 1, V)
            token_logps = logp.gather(-1, ids[0, 1:, None])[:, 0][len(row["prompt_ids"]) - 1 :]
            table[row["row_id"], k] = token_logps.sum()
    return table


def prepared_rows(prepared: Path):
    """The tokenised rows `axolotl preprocess` / `train` saved under a `dataset_prepared_path`."""
    from datasets import load_from_disk

    (folder,) = [p for p in prepared.iterdir() if p.name.startswith("pofe-") and p.is_dir()]
    return load_from_disk(str(folder))


def write_summary(folder: RunFolder, t: int, **fields) -> dict:
    """Round t's summary.json as the pipeline writes it (`pofe.records.candidates`), of no
    candidates but for `fields`: for tests that write a round's candidates by hand."""
    from pofe.records.candidates import CandidatesSummary

    record = CandidatesSummary.model_validate(
        {
            "method": "sppo",
            "rows_in": 0,
            "rows": 0,
            "rows_dropped": {},
            "prompts_truncated": 0,
            "candidates_per_prompt": {"mean": None, "min": 0, "max": 0},
            "candidates_by_source": {},
            "duplicates_removed": {"exact": 0, "near": 0},
            "empty_candidates_removed": 0,
            "candidates_cut_at_user_turn": 0,
            "truncated_candidates_dropped": 0,
            "mean_candidate_reward": None,
            "mean_best_of_k_reward": None,
            "mean_policy_sample_reward": None,
            "mean_candidate_tokens": None,
            "mean_candidate_chars": None,
            "lengths": None,
            "candidates_with_sampled_ids": 0,
            "candidates_without_sampled_ids": 0,
            "candidates_retokenized_differently": 0,
            "mean_best_win_rate": None,
            "mean_win_rate_spread": None,
            "saturation": None,
            "judge_verdicts": 0,
            "judge_abstentions": 0,
            "judge_abstention_reasons": {},
            "judge_abstention_rate": 0.0,
            "judge_prompts_cut": 0,
            "judge_rows_with_prompt_cut": 0,
            "rows_with_equal_labels": 0,
            "judge_pairs_order_sum_off": 0,
            "judge_worst_order_sum": None,
            "data_sha256": "",
            "generate": {},
            "judge": {},
            "pipeline": {},
            **fields,
        }
    )
    record.write(folder.summary(t))
    return record.model_dump(mode="json")


def write_headline(folder: RunFolder, **fields) -> dict:
    """eval/headline.json as the evaluation writes it (`pofe.records.headline`), of no round but
    for `fields`."""
    from pofe.records.headline import Headline

    decoding = {"num_samples": 1, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 8, "seed": 0}
    record = Headline.model_validate(
        {"train_prompts": 0, "skipped": None, "judge": {}, "decoding": decoding, "rounds": {}, "peak_memory": {}}
        | fields
    )
    record.write(folder.headline)
    return record.model_dump(mode="json")


def eval_fields(M: int) -> dict:
    """An eval.json's numbers of M models that no comparison reads (values of no interest to a
    test of the comparisons; `write_evaluation` adds the rest)."""
    per_model = [1.0] * M
    return {
        "num_prompts": 8,  # enough for an interval (MIN_INTERVAL_PROMPTS)
        "prompts_source": "held-out",
        "judge": {"type": "python", "function": "m:f"},
        "judge2": None,
        "decoding": {"num_samples": 1, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4, "seed": 0},
        "win_matrix_method": "bradley_terry",
        "win_matrix": [[0.5] * M] * M,
        "win_matrix_judge2": None,
        "win_matrix_ci95": [[[0.4, 0.6]] * M] * M,
        "mean_reward_judge2": None,
        "mean_response_tokens": per_model,
        "mean_response_chars": per_model,
        "kl_to_pi_0": per_model,
        "perplexity": None,
        "reference_count": 0,
        "response_tokens": {"mean": per_model, "median": per_model},
        "cycle_threshold": 0.5,
        "kl_is_unbiased": True,
    }


def write_evaluation(folder: RunFolder, ev: dict) -> dict:
    """eval/eval.json as the evaluation writes it (`pofe.records.evaluation`): `ev`'s numbers with
    their readings (`with_readings`: cycles, spreads, the choice); what `ev` leaves out and
    the report reads without showing (counts, best-of-k, peak memory, pi_avg, the KL ceiling) is
    empty, and cycle_threshold is its default unless given."""
    from pofe.records.evaluation import EvalRecord
    from pofe.run.evaluation.records import with_readings

    models = len(ev["models"])
    context = {
        "cycle_threshold": 0.5,
        "reward_count": None,
        "abstained": None,
        "reward_count_judge2": None,
        "abstained_judge2": None,
        "samples_cut_at_user_turn": [0] * models,
        "best_of_k": None,
        "peak_memory": {},
        "average": None,
        "kl_ceiling": None,
    }
    record = EvalRecord.model_validate(with_readings(context | ev))
    record.write(folder.evaluation)
    return record.model_dump(mode="json")


def whole_candidates(folder: RunFolder, t: int) -> None:
    """Round t's candidates as a finished preprocess stage leaves them, for tests that mark the
    stage done by hand: a data.jsonl and the summary.json recording its sha256."""
    from pofe.files import file_sha256

    folder.candidates(t).mkdir(parents=True, exist_ok=True)
    (folder.candidates(t) / "data.jsonl").write_text("{}\n")
    write_summary(folder, t, data_sha256=file_sha256(folder.candidates(t) / "data.jsonl"))


def checked_eval_samples(folder: RunFolder, held: list[str], reward=None) -> tuple[dict, list[dict]]:
    """A trained model's evaluation against its base (`axolotl pofe eval` of a recipe): eval.json
    and samples.jsonl, every sample's reward checked as `reward` (default: the demo's) of its
    answer to its held-out prompt (`held`), recomputed here, and each model's mean reward as their mean."""
    if reward is None:
        from pofe.demo.task import reward

    ev = json.loads((folder.eval_dir / "eval.json").read_text())
    samples = [json.loads(line) for line in (folder.eval_dir / "samples.jsonl").read_text().splitlines()]
    for s in samples:
        assert s["reward"] == pytest.approx(reward(held[s["prompt_index"]], s["response"]))
    for m, name in enumerate(("pi_0", "pi_1")):
        mine = [s["reward"] for s in samples if s["model"] == name]
        assert ev["mean_reward"][m] == pytest.approx(sum(mine) / len(mine))
    return ev, samples


def writes_a_user_turn(model_dir: Path, chain: tuple[str, ...] = ("<|assistant|>", "4", "2", "<|user|>", "?")) -> None:
    """Rewrite the tiny model in `model_dir` into a bigram model that follows `chain` and then ends:
    after the generation prompt's `<|assistant|>` it writes "4", "2", then a user turn of its own
    ("<|user|>", "?") and `<|end|>`, whatever the prompt and at any temperature near 1. Each layer's
    output projections are zeroed (the last hidden state is the last token's embedding), the
    embeddings are one-hot (hidden 128 >= 103 tokens) and the output layer maps token a's entry to
    a logit of ~113 (10 x sqrt(128) after the norm) for the token after a in `chain`, else for eos."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert not model.config.tie_word_embeddings
    ids = [tokenizer.convert_tokens_to_ids(t) for t in chain]
    embed = model.model.embed_tokens.weight
    n, hidden = embed.shape
    assert n <= hidden and tokenizer.unk_token_id not in ids
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed.zero_()
        embed[range(n), range(n)] = 1.0
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[model.config.eos_token_id, :] = 10.0
        for a, b in zip(ids, ids[1:]):
            model.lm_head.weight[:, a] = 0.0
            model.lm_head.weight[b, a] = 10.0
    model.save_pretrained(model_dir)
