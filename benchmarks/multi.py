"""Helpers of `benchmarks/gpu_multi.sh`: build the model, data and recipes; summarise a run.

    python -m benchmarks.multi prepare --model 1b --out DIR --backend zero3|fsdp2|ddp --method rrhf|sppo --steps N
    python -m benchmarks.multi summary DIR

`prepare` writes DIR/model (random-init Llama of `benchmarks.run.MODELS`, the demo's
tokenizer), DIR/data.jsonl (the demo task's k = 4 rows) and DIR/recipe.yml. `summary`
prints one line from the run's trainer_state.json and log: the loss after the last step,
unique tokens per second (prompt + responses of the prepared rows x the Trainer's final
`train_samples_per_second`, which the checkpoint's state predates) and the peak memory
axolotl logs per step (`memory/max_allocated`, GiB, rank 0).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import yaml

ZERO3 = {
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "bf16": {"enabled": "auto"},
    "fp16": {"enabled": "auto"},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}
FSDP2 = {
    "fsdp_version": 2,
    "fsdp_config": {
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
        "state_dict_type": "FULL_STATE_DICT",
        "reshard_after_forward": True,
    },
}


def prepare(out: Path, model: str, backend: str, method: str, steps: int, micro_batch: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.run import MODELS
    from pofe.demo.task import make_rrhf_rows, make_sppo_rows, write_jsonl
    from pofe.demo.tiny import build_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    if not (out / "model" / "config.json").exists():
        gpu = torch.cuda.is_available()
        config = LlamaConfig(
            **MODELS[model],
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            max_position_embeddings=2048,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            LlamaForCausalLM(config).to(torch.bfloat16 if gpu else torch.float32).save_pretrained(out / "model")
        tokenizer.save_pretrained(out / "model")
    rows = (make_rrhf_rows if method == "rrhf" else make_sppo_rows)(64 * micro_batch, k=4, seed=0)
    write_jsonl(rows, out / f"{method}.jsonl")
    cpu = not torch.cuda.is_available()
    cfg = {
        "base_model": str(out / "model"),
        "plugins": ["pofe.PofePlugin"],
        "rl": method,
        "datasets": [{"path": str(out / f"{method}.jsonl"), "type": f"pofe.{method}"}],
        "dataset_prepared_path": str(out / "prepared" / method),
        "output_dir": str(out / f"{backend}-{method}"),
        "sequence_len": 256,
        "micro_batch_size": micro_batch,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": 1e-5,
        "lr_scheduler": "constant",
        "optimizer": "adamw_torch",
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": steps,
        "seed": 0,
        "bf16": not cpu,
        "fp16": False,
        "tf32": False,
        "attn_implementation": "eager" if cpu else "sdpa",
        "sample_packing": False,
        "dataloader_num_workers": 0,
        "gradient_checkpointing": not cpu,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "pofe": {"eta": 10.0} if method == "sppo" else {},
    }
    if backend == "zero3":
        (out / "zero3.json").write_text(json.dumps(ZERO3, indent=1))
        cfg["deepspeed"] = str(out / "zero3.json")
    elif backend == "fsdp2":
        cfg.update(FSDP2)
    path = out / f"{backend}-{method}.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def summary(run: Path) -> str:
    from datasets import load_from_disk

    cfg = yaml.safe_load(run.with_suffix(".yml").read_text())
    states = sorted(run.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    history = json.loads(states[-1].read_text())["log_history"]
    steps = [h for h in history if "loss" in h]
    rates = re.findall(r"'train_samples_per_second': '?([0-9.]+)", run.with_suffix(".log").read_text())
    prepared = next(p for p in Path(cfg["dataset_prepared_path"]).iterdir() if p.is_dir())
    data = load_from_disk(str(prepared))
    tokens = statistics.mean(len(p) + sum(map(len, r)) for p, r in zip(data["prompt_ids"], data["response_ids"]))
    peak = max((h.get("memory/max_allocated (GiB)", 0.0) for h in steps), default=0.0)
    return (
        f"{run.name}: loss after {steps[-1]['step']} steps {steps[-1]['loss']:.4f}, "
        f"{float(rates[-1]) * tokens:,.0f} unique tokens/s, peak {peak:.2f} GiB per GPU"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="1b")
    p.add_argument("--backend", choices=("zero3", "fsdp2", "ddp"), required=True)
    p.add_argument("--method", choices=("rrhf", "sppo"), required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--micro-batch", type=int, default=2)
    s = sub.add_parser("summary")
    s.add_argument("run", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        print(prepare(args.out, args.model, args.backend, args.method, args.steps, args.micro_batch))
    else:
        print(summary(args.run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
