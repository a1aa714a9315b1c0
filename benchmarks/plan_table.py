"""The README's memory table, made by `axolotl pofe plan --json` on the two SPPO Mistral-7B recipes.

    python -m benchmarks.plan_table            # print the table
    python -m benchmarks.plan_table --write    # rewrite README.md's block with it

No download: the models' published config.json files (Mistral-7B-Instruct-v0.2, PairRM's ranker
config and its DeBERTa-v3-large backbone) are written into a temporary hub cache, which `plan`
reads as it reads the real one. tests/run/plan/test_plan.py checks that README.md holds this table.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MISTRAL_7B = {  # mistralai/Mistral-7B-Instruct-v0.2's config.json
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PAIRRM = {  # llm-blender/PairRM's config.json: llm-blender's ranker config, naming the backbone
    "ranker_type": "pairranker",
    "model_type": "deberta",
    "model_name": "microsoft/deberta-v3-large",
    "source_maxlength": 1224,
    "candidate_maxlength": 412,
    "n_tasks": 1,
}
DEBERTA_V3_LARGE = {  # microsoft/deberta-v3-large's config.json
    "model_type": "deberta-v2",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "vocab_size": 128100,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": "p2c|c2p",
    "layer_norm_eps": 1e-07,
    "max_relative_positions": -1,
    "position_biased_input": False,
    "type_vocab_size": 0,
    "hidden_act": "gelu",
}
QWEN25_7B = {  # Qwen/Qwen2.5-7B-Instruct's config.json
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
}
LLAMA31_8B = {  # meta-llama/Llama-3.1-8B-Instruct's config.json (rope_scaling left out: no memory effect)
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
}
SKYWORK_RM = {  # Skywork/Skywork-Reward-V2-Llama-3.1-8B's config.json: Llama-3.1-8B, one score head
    **LLAMA31_8B,
    "architectures": ["LlamaForSequenceClassification"],
    "num_labels": 1,
    "vocab_size": 128257,
}
CONFIGS = {
    "mistralai/Mistral-7B-Instruct-v0.2": MISTRAL_7B,
    "Qwen/Qwen2.5-7B-Instruct": QWEN25_7B,
    "meta-llama/Llama-3.1-8B-Instruct": LLAMA31_8B,
    "Skywork/Skywork-Reward-V2-Llama-3.1-8B": SKYWORK_RM,
    "llm-blender/PairRM": PAIRRM,
    "microsoft/deberta-v3-large": DEBERTA_V3_LARGE,
}
# The authors' iteration-1 prompt set holds about 20k prompts (a hub dataset: plan counts it only with --prompts)
PROMPTS = 20000
# What the README's recipe table claims for each shipped GPU recipe: (GPUs, smallest GPU, largest GPU
# in GB). `python -m benchmarks.plan_table --claims` plans each at both sizes; tests/run/plan holds
# the README to `claim_text` and every plan to no stage over its GPU.
CLAIMS = {
    "sppo-qlora.yml": (1, 24, 80),
    "rrhf-qlora.yml": (1, 24, 80),
    "rrhf-qlora-online.yml": (1, 40, 80),  # the reward model stays on the GPU beside the policy
    "sppo-zero3.yml": (8, 40, 80),
    "rrhf-zero3.yml": (8, 40, 80),
}
CASES = {  # column title -> (recipe, GPUs)
    "`sppo-qlora.yml`, 1 x 80 GB GPU": ("recipes/sppo-qlora.yml", 1),
    "`sppo-zero3.yml`, 8 x 80 GB GPUs": ("recipes/sppo-zero3.yml", 8),
}


def write_hub_cache(cache: Path) -> None:
    """The hub cache's layout (models--org--name/refs/main, snapshots/<rev>/config.json) for CONFIGS."""
    for repo, config in CONFIGS.items():
        folder = cache / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text("0" * 40)
        snapshot = folder / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))


def claim_text(gpus: int, smallest: float, largest: float) -> str:
    """How the README's recipe table says a claim: "one 24-80 GB GPU", "8 x 40-80 GB GPUs"."""
    return f"one {smallest:g}-{largest:g} GB GPU" if gpus == 1 else f"{gpus} x {smallest:g}-{largest:g} GB GPUs"


def plan_json(recipe: str, gpus: int, cache: Path, gpu_memory: float = 80.0) -> dict:
    """`axolotl pofe plan RECIPE --json --gpus N --gpu-memory G --prompts PROMPTS`, run in this
    process from the repository root (the recipes name their DeepSpeed JSON relative to it),
    reading `cache`."""
    from unittest import mock

    from click.testing import CliRunner
    from huggingface_hub import constants

    from pofe.cli import pofe

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with mock.patch.object(constants, "HF_HUB_CACHE", str(cache)):
            result = CliRunner().invoke(
                pofe,
                ["plan", recipe, "--json", "--gpus", str(gpus), "--gpu-memory", f"{gpu_memory:g}"]
                + ["--prompts", str(PROMPTS)],
            )
    finally:
        os.chdir(cwd)
    if result.exit_code != 0:
        raise RuntimeError(f"axolotl pofe plan {recipe} failed: {result.output}") from result.exception
    return json.loads(result.stdout)  # stderr (library warnings) apart


def plans() -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        write_hub_cache(Path(tmp))
        return {title: plan_json(recipe, gpus, Path(tmp)) for title, (recipe, gpus) in CASES.items()}


def claim_plans() -> dict[tuple[str, float], dict]:
    """Each claimed recipe's plan at its smallest and its largest claimed GPU."""
    with tempfile.TemporaryDirectory() as tmp:
        write_hub_cache(Path(tmp))
        return {
            (name, memory): plan_json(f"recipes/{name}", gpus, Path(tmp), memory)
            for name, (gpus, *sizes) in CLAIMS.items()
            for memory in sizes
        }


def over_the_gpu(plan: dict) -> list[str]:
    """A plan's warnings that a stage does not fit its GPUs (memory, vLLM's share, the workers' GPUs)."""
    return [w for w in plan["warnings"] if "exceeds a" in w or "vLLM needs" in w or w.startswith("pofe.candidates")]


def table() -> str:
    from pofe.run.plan.render import readme_table

    return readme_table(plans())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="Rewrite README.md's generated block.")
    parser.add_argument("--claims", action="store_true", help="Plan each recipe at the GPU sizes README claims.")
    args = parser.parse_args()
    if args.claims:
        for (name, memory), plan in claim_plans().items():
            stages = ", ".join(
                f"{s['stage']} {s['gpu_memory_gb']:g}" for s in plan["stages"] if s["round"] in (1, None)
            )
            print(
                f"{name} at {CLAIMS[name][0]} x {memory:g} GB: {stages}; over the GPU: {over_the_gpu(plan) or 'none'}"
            )
        return
    text = table()
    if args.write:
        from pofe.run.plan.render import replace_block

        readme = ROOT / "README.md"
        readme.write_text(replace_block(readme.read_text(), text))
    print(text)


if __name__ == "__main__":
    main()
