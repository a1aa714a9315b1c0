"""Evaluation's answers kept between evaluations of one run, in `eval/answers/<model>.json`.

A run with `pofe.stop_when` evaluates every finished iterate after each round: without a
store, pi_0 answers the held-out prompts T times in a T-round run, and round t's model
T - t + 1 times. A model's answers are a function of its weights, the prompts, the
tokenizer that renders them and the decoding (the same seeds every time), so each part a
model gives (its held-out answers, the next round's held-out candidates, its headline
answers) is stored under a key of exactly those, and a later evaluation reads the part
instead of loading the model. A weight file written again (a round trained anew), another
prompt, or another decoding setting changes the key: that part is answered again.

A local model is identified by the size and modification time of its top-level files
(what `from_pretrained` reads; checkpoint folders are not), a hub model by its id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pofe.files import stable_hash, write_atomic
from pofe.preprocess.generators.hf import Sample

from .answers import ModelAnswers


def model_identity(path: str) -> Any:
    """What changes when the weights at `path` change: [name, size, mtime_ns] of a local
    folder's files, or the hub id."""
    folder = Path(path)
    if not folder.is_dir():
        return path
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(folder.iterdir()) if f.is_file()]


def samples_to_json(samples: list[list[Sample]]) -> list[list[dict]]:
    return [[asdict(s) for s in row] for row in samples]


def samples_from_json(rows: list[list[dict]]) -> list[list[Sample]]:
    return [[Sample(**s) for s in row] for row in rows]


def answers_to_json(a: ModelAnswers) -> dict:
    """A model's held-out answers, but for pi_0's log-probs of them (scored anew each time)."""
    return {"samples": samples_to_json(a.samples), "logps": a.logps, "perplexity": a.perplexity}


def answers_from_json(name: str, path: str, value: dict) -> ModelAnswers:
    return ModelAnswers(name, path, samples_from_json(value["samples"]), value["logps"],
                        perplexity=value["perplexity"])


class AnswerStore:
    """Each model's stored parts, read once per evaluation and written as parts are added."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _file(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def _read(self, name: str) -> dict:
        path = self._file(name)
        return json.loads(path.read_text()) if path.exists() else {}

    def get(self, name: str, part: str, key: dict) -> Any | None:
        """The stored value of `name`'s `part` when it was stored under `key`; else None."""
        entry = self._read(name).get(part)
        return entry["value"] if entry and entry["key"] == stable_hash(key) else None

    def put(self, name: str, part: str, key: dict, value: Any) -> None:
        parts = self._read(name)
        parts[part] = {"key": stable_hash(key), "value": value}
        write_atomic(self._file(name), json.dumps(parts, allow_nan=True) + "\n")

    def part(self, name: str, part: str, key: dict, make: Callable[[], Any]) -> Any:
        """`name`'s `part` as stored under `key`, else `make()` stored under it. Either way
        the value has been through JSON, so a stored part and a fresh one read alike."""
        if self.get(name, part, key) is None:
            self.put(name, part, key, make())
        return self.get(name, part, key)
