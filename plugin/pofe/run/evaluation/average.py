"""pi_avg (`pofe.eval.average_iterates`): the weights of pi_1..pi_T averaged into one model.

SPPO's theory guarantees the AVERAGE of its iterates, not the last one: when the judge's
preferences are intransitive the last iterate can cycle while the average converges (the
seed's four-response game: the multiplicative-weights average at exploitability 0.0034, the
last iterate at 0.389; tests/losses/test_sppo_game.py). Averaging the policies' weights is the
practical stand-in the SPPO seed names ("average checkpoints"), as in model soups and
stochastic weight averaging: it averages parameters, not the mixture of the iterates'
distributions, and both are what the evaluation measures, pi_avg answering the held-out prompts
like any iterate.

    theta_avg = (1 / T) sum_{t=1..T} theta_t      (every tensor, accumulated in float32)

Each iterate is a whole model folder (full fine-tuning: round t's output; LoRA/QLoRA: round t's
merged model, so LoRA iterates average as merged weights). The average is written tensor by
tensor, in the first iterate's shard layout: at most one shard of averages and one tensor of
each iterate are in memory. The folder is rebuilt only when an iterate's weights changed
(`pofe.files.weights_fingerprint`, recorded in `pofe-average.json`), so evaluation's stored
answers of pi_avg stay valid across `axolotl pofe eval` runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pofe.errors import PofeError
from pofe.files import weights_fingerprint, write_atomic
from pofe.logs import Echo

RECORD = "pofe-average.json"
INDEX = "model.safetensors.index.json"


class AverageError(PofeError):
    """The iterates cannot be averaged (no safetensors weights, or tensors that differ)."""


def _weight_files(model: Path) -> dict[str, str]:
    """{tensor name: the safetensors file in `model` that holds it}."""
    index = model / INDEX
    if index.exists():
        return json.loads(index.read_text())["weight_map"]
    single = model / "model.safetensors"
    if not single.exists():
        raise AverageError(
            f"pofe.eval.average_iterates: {model} holds no model.safetensors (nor {INDEX}); pi_avg averages "
            "safetensors weights: save the iterates with save_safetensors: true (axolotl's default)"
        )
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), "model.safetensors")


def _check_same_tensors(names: list[str], layouts: list[dict[str, str]]) -> None:
    first = set(layouts[0])
    for name, layout in zip(names[1:], layouts[1:]):
        if set(layout) != first:
            differ = sorted(first ^ set(layout))[:5]
            raise AverageError(
                f"pofe.eval.average_iterates: {names[0]} and {name} hold different tensors (e.g. {differ}): "
                "only iterates of one architecture average; set average_iterates: false"
            )


def average_weights(iterates: list[tuple[str, Path]], out: Path, echo: Echo = print) -> Path:
    """Write pi_avg, the mean of the `iterates`' weights ([(name, model folder)], T >= 2), to
    `out` (its other files, config and tokenizer, copied from the last iterate); return `out`.
    Reused as it is when `out` was built from the same iterates with the same weights."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    names = [name for name, _ in iterates]
    folders = [Path(path) for _, path in iterates]
    record = {"of": names, "weights": [weights_fingerprint(p) for p in folders]}
    if (out / RECORD).exists() and json.loads((out / RECORD).read_text()) == record:
        echo(f"eval: pi_avg ({', '.join(names)}) unchanged in {out}")
        return out
    layouts = [_weight_files(p) for p in folders]
    _check_same_tensors(names, layouts)
    building = out.with_name(out.name + ".tmp")
    shutil.rmtree(building, ignore_errors=True)
    shutil.copytree(folders[-1], building, ignore=shutil.ignore_patterns("*.safetensors", INDEX, "checkpoint-*"))
    if (folders[0] / INDEX).exists():  # the shards below follow the first iterate's layout
        shutil.copyfile(folders[0] / INDEX, building / INDEX)
    by_file: dict[str, list[str]] = {}
    for tensor, file in layouts[0].items():
        by_file.setdefault(file, []).append(tensor)
    for file, tensors in by_file.items():
        shard = {}
        for tensor in tensors:
            total, dtype = None, None
            for folder, layout in zip(folders, layouts):
                with safe_open(str(folder / layout[tensor]), framework="pt") as f:
                    value = f.get_tensor(tensor)
                if total is not None and value.shape != total.shape:
                    raise AverageError(f"pofe.eval.average_iterates: {tensor} differs in shape between iterates")
                dtype = value.dtype
                total = value.float() if total is None else total + value.float()
            shard[tensor] = (total / len(folders)).to(dtype).contiguous()
        save_file(shard, str(building / file), metadata={"format": "pt"})
    write_atomic(building / RECORD, json.dumps(record, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    building.rename(out)
    echo(f"eval: pi_avg = the mean of {', '.join(names)}'s weights -> {out}")
    return out
