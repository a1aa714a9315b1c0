"""Whether a model folder's weights are whole: every file `from_pretrained` reads, none cut short.

A training killed before its end leaves config.json (axolotl writes it at the start) and no
weights; a copy or a save cut short (a full disk) leaves a weights file smaller than its header
says, or an index naming a shard that is not there. transformers' own errors then name no file
(a safetensors traceback) or come after the state of whatever loads it is written.
`weights_problem` says which file, before anything loads: `axolotl pofe eval` checks the model it
evaluates with it (`pofe.run.evaluation.trained`), a resumed round its checkpoint
(`pofe.run.rounds.checkpoints`).
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

from transformers.utils import (
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
)

# the weights files transformers (and PEFT, for an adapter) look for, any one of which will do
WEIGHTS = (
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    ADAPTER_SAFE_WEIGHTS_NAME,
    ADAPTER_WEIGHTS_NAME,
)
INDEXES = (SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_INDEX_NAME)


def _safetensors_problem(path: Path) -> str | None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path} has {size} bytes, not even its header's length"
        (n,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return f"{path}'s header is cut short or not JSON"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    need = 8 + n + max(ends, default=0)
    return None if size >= need else f"{path} has {size} bytes; its header says {need}"


def file_problem(path: Path) -> str | None:
    """Why a weights or checkpoint file is unusable (cut short), or None. Cheap: a safetensors
    file's header against its size; a torch (zip) file's central directory, which is written last."""
    if path.suffix == ".safetensors":
        return _safetensors_problem(path)
    if path.suffix in (".pt", ".pth", ".bin") and path.stat().st_size:
        try:
            zipfile.ZipFile(path).close()
        except (zipfile.BadZipFile, OSError) as e:
            return f"{path} is cut short or damaged ({e})"
    return None


def weights_problem(folder: Path) -> str | None:
    """Why `from_pretrained` could not load `folder`'s weights whole, or None: it holds none of
    `WEIGHTS`, an index is unreadable or names a shard that is missing, or a weights file or a
    shard is cut short."""
    names = [name for name in WEIGHTS if (folder / name).is_file()]
    if not names:
        return f"{folder} holds no weights (none of {', '.join(WEIGHTS)})"
    files = [folder / name for name in names if name not in INDEXES]
    for index in [name for name in names if name in INDEXES]:
        try:
            shards = sorted(set(json.loads((folder / index).read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{folder / index} is cut short or holds no weight_map"
        if missing := [s for s in shards if not (folder / s).is_file()]:
            return f"{folder} lacks {', '.join(missing)}, named in its {index}"
        files += [folder / s for s in shards]
    for path in files:
        if problem := file_problem(path):
            return problem
    return None
