"""Evaluation's answers: what a loaded policy gives the held-out part (`pofe.run.evaluation.evaluate`).

Each model's samples on the held-out prompts (the same seeds for every model, from the
sampler `pofe.run.evaluation.sampler` chose: the rounds' vLLM engine, or `model.generate`), their summed log-probs
under the model (`pofe.scoring.response_logps`), its perplexity of the reference responses,
and pi_0's log-probs of every model's samples (the KL estimate). Each function takes a model
its caller loaded; evaluation loads one at a time and frees it before the next, and builds
the judges only after all of them.

The answers are kept between evaluations of one run (`AnswerStore`, `eval/answers/<model>.json`).
A run with `pofe.stop_when` evaluates every finished iterate after each round: without a
store, pi_0 answers the held-out prompts T times in a T-round run, and round t's model
T - t + 1 times. A model's answers are a function of its weights, the prompts, the
tokenizer that renders them and the decoding (the same seeds every time), so each part a
model gives (its held-out answers, the next round's held-out candidates, its headline
answers) is stored under a key of exactly those, and a later evaluation reads the part
instead of loading the model. A weight file written again (a round trained anew), another
prompt, or another decoding setting changes the key: that part is answered again.

A model is identified by `pofe.files.weights_fingerprint` (a local folder by its files, a
hub model by its cached commit).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from pofe.args.rounds import EvalConfig
from pofe.columns import IGNORE_INDEX
from pofe.files import stable_hash, write_atomic
from pofe.scoring import response_logps
from pofe_candidates.config import GenerateConfig, Sampling
from pofe_candidates.generators.hf import Sample

TokenPair = tuple[list[int], list[int]]  # (prompt ids, response ids)


@torch.no_grad()
def sequence_logps(
    model, prompt_ids: list[list[int]], response_ids: list[list[int]], batch_size: int = 16
) -> list[float]:
    """Summed log pi(response | prompt) for each pair, by `pofe.scoring.response_logps`.

    Rows `prompt + response` are right-padded (positions start at 0 for every row); only
    response tokens are labelled, so only they count. An empty response scores 0.
    """
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts, responses = prompt_ids[start : start + batch_size], response_ids[start : start + batch_size]
        rows = [p + r for p, r in zip(prompts, responses, strict=True)]
        T = max(len(row) for row in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)  # (B, T)
        mask = torch.zeros(len(rows), T, dtype=torch.long)  # (B, T)
        labels = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)  # (B, T)
        for i, (prompt, row) in enumerate(zip(prompts, rows)):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            labels[i, len(prompt) : len(row)] = ids[i, len(prompt) : len(row)]
        logp_sum, _ = response_logps(model, ids.to(device), mask.to(device), labels.to(device))  # (B,)
        out += logp_sum.tolist()
    return out


@dataclass
class ModelAnswers:
    """One model's held-out samples, with log-probs flat in prompt-major order (P * S)."""

    name: str
    path: str
    samples: list[list[Sample]]  # [prompt][sample]
    logps: list[float]  # log pi_m(y|x)
    pi_0_logps: list[float] = field(default_factory=list)  # log pi_0(y|x)
    perplexity: float | None = None

    @property
    def flat(self) -> list[Sample]:
        return [s for row in self.samples for s in row]


def held_out_sampling(ecfg: EvalConfig, generate: GenerateConfig | None) -> Sampling:
    return Sampling(
        temperature=ecfg.temperature, top_p=ecfg.top_p, max_new_tokens=ecfg.held_out_tokens(generate), seed=ecfg.seed
    )


@dataclass(frozen=True)
class HeldOut:
    """The held-out prompts (rendered once, for every model and judge), their references, and
    each prompt's other columns (TRL-style reward functions take them, as when the candidates
    were judged)."""

    prompts: list
    rendered: list[str]
    references: list[TokenPair]
    source: str  # where the prompts came from, for eval.json
    columns: list[dict]


def other_columns(rows: list[dict], prompt_column: str) -> list[dict]:
    """Each row's columns but its prompt, as the judge stage passes them (`judge_stage`)."""
    return [{c: v for c, v in r.items() if c != prompt_column} for r in rows]


def reference_pairs(tokenizer, prompts: list, references: list, as_text: list[bool] | None = None) -> list[TokenPair]:
    """(prompt ids, response ids) of each non-empty reference, as the rendered assistant turn, or
    as text where `as_text` says the prompt trained as text (`pofe.data.tokenize.text_token_ids`)."""
    from pofe.data.tokenize import render_row, text_token_ids

    pairs = []
    for prompt, reference, text in zip(prompts, references, as_text or [False] * len(prompts)):
        if isinstance(reference, str) and reference and text:
            prompt_ids, (response_ids,), _ = text_token_ids(prompt, [reference], tokenizer)
            pairs.append((prompt_ids, response_ids))
        elif isinstance(reference, str) and reference:
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            row = {"prompt": messages, "responses": [{"role": "assistant", "content": reference}]}
            prompt_text, (response_text,) = render_row(row, tokenizer)
            pairs.append(
                (
                    tokenizer(prompt_text, add_special_tokens=False)["input_ids"],
                    tokenizer(response_text, add_special_tokens=False)["input_ids"],
                )
            )
    return pairs


def perplexity(model, pairs: list[TokenPair], batch_size: int) -> float | None:
    """exp(total NLL / total tokens) of the reference responses; None without references."""
    if not pairs:
        return None
    nll = -sum(sequence_logps(model, [p for p, _ in pairs], [r for _, r in pairs], batch_size))
    return math.exp(nll / sum(len(r) for _, r in pairs))


def answer(
    model, name: str, path: str, samples: list[list[Sample]], held_out: HeldOut, ecfg: EvalConfig
) -> ModelAnswers:
    """One model's held-out samples (sampled with the same seeds for every model,
    `pofe.run.evaluation.sampler`) with their log-probs under `model`, and its reference perplexity."""
    flat = [s for row in samples for s in row]
    logps = sequence_logps(model, [s.prompt_ids for s in flat], [s.response_ids for s in flat], ecfg.batch_size)
    return ModelAnswers(name, path, samples, logps, perplexity=perplexity(model, held_out.references, ecfg.batch_size))


def score_under_pi_0(pi_0, answers: list[ModelAnswers], batch_size: int) -> None:
    """Fill `pi_0_logps`: log pi_0 of every model's samples, `pi_0` being the model (pi_0's own
    samples: its `logps`)."""
    answers[0].pi_0_logps = list(answers[0].logps)
    for a in answers[1:]:
        flat = a.flat
        a.pi_0_logps = sequence_logps(pi_0, [s.prompt_ids for s in flat], [s.response_ids for s in flat], batch_size)


def samples_to_json(samples: list[list[Sample]]) -> list[list[dict]]:
    return [[asdict(s) for s in row] for row in samples]


def samples_from_json(rows: list[list[dict]]) -> list[list[Sample]]:
    return [[Sample(**s) for s in row] for row in rows]


def answers_to_json(a: ModelAnswers) -> dict:
    """A model's held-out answers, but for pi_0's log-probs of them (scored anew each time)."""
    return {"samples": samples_to_json(a.samples), "logps": a.logps, "perplexity": a.perplexity}


def answers_from_json(name: str, path: str, value: dict) -> ModelAnswers:
    return ModelAnswers(
        name, path, samples_from_json(value["samples"]), value["logps"], perplexity=value["perplexity"]
    )


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
