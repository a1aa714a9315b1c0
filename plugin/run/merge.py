"""LoRA / QLoRA between rounds: axolotl's `merge-lora` merges the adapter into the round's base.

The merged model becomes the next round's `base_model` (which trains a fresh adapter). The
runner's merge stage is

    axolotl merge-lora round-<t>/recipe.yml --lora-model-dir round-<t>/train --output-dir round-<t>

whose default (`merge_method: memory_efficient`) adds the adapter's delta shard by shard,
never holding the whole model in memory, and writes `round-<t>/merged` (axolotl always
writes `<output_dir>/merged`), with the base's non-weight files (config, tokenizer). The
base's dtype is kept; on a float32 LoRA the weights equal peft's `merge_and_unload` exactly.
QLoRA: axolotl adds the delta to the NF4 round trip of every 2-D base weight, the embeddings
and lm_head included, which QLoRA training keeps in float (on the tiny model: max abs diff
1.0e-2 to the float merge); `merge_method: legacy` in the recipe takes axolotl's whole-model
float merge instead (equal to `merge_and_unload`). The next round quantises the merged model again.
"""

from __future__ import annotations

from pathlib import Path

from .stages import axolotl_command


def merge_command(recipe: Path, adapter: Path, round_dir: Path) -> list[str]:
    """The merge stage's command: `adapter` into the `recipe`'s base_model, to `round_dir/merged`."""
    return axolotl_command(
        "merge-lora", str(recipe), f"--lora-model-dir={adapter}", f"--output-dir={round_dir}",
    )
