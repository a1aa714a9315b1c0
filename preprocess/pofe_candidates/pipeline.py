"""Candidates from prompts: generate -> judge -> build, resumable shard by shard.

    result = run_pipeline(rows, method="rrhf", generate=GenerateConfig(...),
                          judge=JudgeConfig(...), candidates=CandidatesConfig(out_dir="cands"),
                          policy_path="path/to/policy")

Layout of `out_dir`:
    generate/manifest.json       prompts and generate settings (a restart must match them)
    generate/shard-NNNNN.jsonl   candidates per prompt (after dedupe), finish reasons, lengths, drop reasons
    judge/manifest.json          judge settings and method (manifest.py)
    judge/shard-NNNNN.jsonl      kept responses with rewards and/or win rates, abstentions
    judge-<key>/                 an earlier judge's shards (a judge change reuses generate/)
    data.jsonl                   the trainers' input rows, in prompt order (build.py)
    summary.json                 counts and statistics (see `build.summarise`), data.jsonl's sha256
    pofe-candidates.lock         held while a process builds the folder: a second is refused
    workers/                     with candidates.num_workers > 1 (parallel.py): each worker's
                                 log (worker-N.log), report (worker-N.json) and generator files

Every shard is written atomically (pofe.files) and verified when a restart reads it back
(shards.py): a damaged one is redone and counted. A run killed at any point and started again
with the same arguments redoes only the missing shards, and its data.jsonl is byte for byte
the one an uninterrupted run writes: generation is seeded per shard (`seed + shard *
SHARD_SEED_STRIDE`), never from a running RNG.

SPPO with a scalar judge: win rates come from Bradley-Terry preferences
P[i, j] = sigmoid(r_i - r_j). This makes preferences transitive by construction (no
A > B > C > A cycles, which only a pairwise judge can express); the win rates then order
candidates exactly as the rewards do.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from pofe.errors import PofeError
from pofe.files import file_sha256, write_jsonl_atomic
from pofe.locks import FolderLock, describe, here_and_gone
from pofe.logs import logger_name
from pofe.methods import check_candidate_rules, method_spec
from pofe.records.candidates import CandidatesSummary
from pofe_candidates.build import build_rows, empty_samples_warning, order_sum_warning, summarise
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig, redact
from pofe_candidates.generate_stage import SHARD_SEED_STRIDE, generate_stage
from pofe_candidates.generators import Generator
from pofe_candidates.judge_stage import judge_stage
from pofe_candidates.judges import PairwiseJudge, ScalarJudge, make_judge
from pofe_candidates.manifest import check_manifest, generate_manifest, judge_manifest, select_judge_dir
from pofe_candidates.parallel import check_parallel, run_workers, worker_devices
from pofe_candidates.shard_work import StagePlan, close_generator, column_texts, free_memory
from pofe_candidates.shards import (
    clean_tmp,
)
from pofe_candidates.win_rates import SATURATION_BAND

LOG = logging.getLogger(logger_name(__name__))


@dataclass(frozen=True)
class PipelineResult:
    data_path: Path
    summary_path: Path
    rows: int
    summary: dict


@dataclass(frozen=True)
class StagesDone:
    """What `run_stages` did: each shard's rows as read back (None: not this process's, or
    not reached), and per-run facts for summary.json."""

    generated: list[list[dict] | None]
    judged: list[list[dict] | None] | None
    timings: dict[str, float]
    redone: dict[str, int]
    requests: dict[str, dict]


# held while a process builds the folder (`pofe.locks`)
LOCK_NAME = "pofe-candidates.lock"


class CandidatesLocked(PofeError, RuntimeError):
    """Another process is building the same candidates folder."""

    @classmethod
    def of(cls, out_dir: Path, holder: dict) -> CandidatesLocked:
        if here_and_gone(holder):
            return cls(
                f"{out_dir} is locked by a process that outlived the one that started building it "
                f"({describe(holder)}). Wait for it to exit (`fuser -v {out_dir / LOCK_NAME}` lists it), then run again."
            )
        stop = f" (kill {holder['pid']})" if holder.get("host") == socket.gethostname() else ""
        return cls(
            f"{out_dir} is being built by `{holder.get('command')}` ({describe(holder)}); a second build of one "
            "candidates folder would generate and judge every prompt again (and pay a served API twice). Wait for "
            f"it to finish, or stop it{stop}, then run again; or set pofe.candidates.out_dir to another folder."
        )


def _holder_command() -> str:
    """This process's command as the lock records it: `axolotl preprocess recipe.yml`, `axolotl pofe
    candidates recipe.yml` (its first words: the rest may be options holding a key)."""
    return " ".join([Path(sys.argv[0]).name, *sys.argv[1:4]])


def run_pipeline(
    prompts_rows: Sequence[dict],
    *,
    method: str,
    generate: GenerateConfig,
    judge: JudgeConfig,
    candidates: CandidatesConfig,
    policy_path: str,
    prompt_column: str = "prompt",
    generator: Generator | None = None,
    judge_impl: ScalarJudge | PairwiseJudge | None = None,
    stop_after: Literal["generate", "judge"] | None = None,
    tokenizer=None,
    saturation_band: float = SATURATION_BAND,
) -> PipelineResult | None:
    """Generate, judge and build the candidate dataset; resume from whatever shards exist.

    Args:
        prompts_rows: N dicts, each with `prompt_column` (a string or chat messages) and any
            columns named in generate.include_dataset_responses.
        method: a registered method (pofe.methods); its target column is what rows carry.
        generate / judge / candidates: the `pofe.generate` / `pofe.judge` / `pofe.candidates`
            blocks; candidates.out_dir must be set. candidates.num_workers > 1 runs the
            generate and judge stages in that many processes (parallel.py).
        policy_path: the policy (tokenizer for the chat template; default generation model).
        generator / judge_impl: pre-built backends (tests, or callers that reuse one model
            across calls); built from the configs when None, and only if a shard needs them
            (but a python judge is loaded at once: a bad judge.function fails before generating).
            A generator built here is closed (its memory freed) before the judge loads; a
            passed one belongs to the caller.
        stop_after: run the stages up to this one only (their shards stay for a later run);
            then nothing is built and None is returned.
        saturation_band: summary.json's saturation (`pofe.saturation_band`, win-rate methods).
        tokenizer: what prompts are rendered with (and the transformers backend decodes with);
            None: policy_path's own (AutoTokenizer). Inside axolotl it is the training one
            (axolotl's load_tokenizer: the recipe's chat_template and its settings).
    Returns:
        PipelineResult with data.jsonl's path, summary.json's path, the row count and summary.
    """
    # everything checked before any model loads
    check_candidate_rules(method, pairwise_judge=judge.type if judge.is_pairwise else None, keep=candidates.keep)
    if candidates.out_dir is None:
        raise ValueError("run_pipeline needs candidates.out_dir (CandidatesConfig(out_dir=...))")
    generate = generate.for_method(method)  # dedupe: the method's default unless set
    candidates = candidates.for_method(method)  # truncated: the method's default unless set
    rows = list(prompts_rows)
    _check_inputs(rows, prompt_column, generate, candidates)
    prebuilt = [name for name, obj in (("generator", generator), ("judge", judge_impl)) if obj is not None]
    check_parallel(generate, candidates, prebuilt=prebuilt)
    devices = worker_devices(generate, candidates) if candidates.num_workers > 1 else []
    if judge_impl is None and judge.spec.calls_functions:
        judge_impl = make_judge(judge)  # imports judge.function now, not after generating
    out_dir = Path(candidates.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # one process builds a folder: a second would generate and judge (and pay a served API for) it all again
    with FolderLock.acquire(out_dir / LOCK_NAME, LOG.info, _holder_command(), partial(CandidatesLocked.of, out_dir)):
        gen_dir, judge_dir = _ready_out_dir(
            out_dir,
            {
                **generate_manifest(
                    rows,
                    policy_path=policy_path,
                    generate=generate,
                    shard_size=candidates.shard_size,
                    prompt_column=prompt_column,
                ),
                "truncated": candidates.truncated,  # the shards hold what this policy kept
            },
            judge_manifest(method=method, judge=judge),
        )
        plan = StagePlan(
            rows,
            method,
            method_spec(method).target,
            generate,
            judge,
            candidates,
            policy_path,
            prompt_column,
            gen_dir,
            judge_dir,
        )

        reports: list[dict] = []
        t0 = time.monotonic()
        if plan.candidates.num_workers > 1:
            n_shards = math.ceil(len(plan.rows) / plan.candidates.shard_size)
            reports = run_workers(plan, tokenizer, stop_after, n_shards, devices)
        workers_s = time.monotonic() - t0
        # every shard read back (and verified) here; in one process, this does all the work
        done = run_stages(plan, generator=generator, judge_impl=judge_impl, tokenizer=tokenizer, stop_after=stop_after)
        if stop_after is not None:
            return None
        return _write_outputs(plan, done, _last_run_facts(done, reports, workers_s), saturation_band)


def _ready_out_dir(out: Path, gen_manifest: dict, judge_fields: dict) -> tuple[Path, Path]:
    """out_dir's generate and judge folders, made ready: the generate manifest checked (a
    restart must match it), this judge's folder chosen (manifest.py), and temporary files a
    killed run left removed."""
    gen_dir = out / "generate"
    gen_dir.mkdir(parents=True, exist_ok=True)
    check_manifest(gen_dir, gen_manifest)
    judge_dir = select_judge_dir(out, judge_fields)
    for d in (gen_dir, judge_dir):
        clean_tmp(d)
    return gen_dir, judge_dir


def _last_run_facts(done: StagesDone, reports: list[dict], workers_s: float) -> dict:
    """summary.json's facts about this run alone (a resumed run counts only its own work): shards
    redone, timings, the workers' reports (`reports`: [] in one process), API request counts."""
    redone = Counter(done.redone)
    for report in reports:
        redone.update(report["redone"])
    timings = {**done.timings, **({"workers_s": workers_s} if reports else {})}
    rounded = {k: round(v, 3) for k, v in timings.items()}
    facts: dict = {"shards_redone_last_run": dict(redone), "timings_last_run": rounded}
    if reports:
        facts["workers_last_run"] = reports
    for name, stats in done.requests.items():
        facts[f"{name}_requests_last_run"] = stats
    return facts


def _no_rows(plan: StagePlan, generated: list[dict], summary: dict, dropped: dict, summary_path: Path) -> str:
    """Why no prompt gave a training row: what was dropped, and where the candidates went."""
    empty, cut = summary["empty_candidates_removed"], summary["truncated_candidates_dropped"]
    duplicates = sum(summary["duplicates_removed"].values())
    total = sum(len(g["candidates"]) for g in generated) + empty + cut + duplicates
    why = (
        f"none of the {len(plan.rows)} prompts gave a training row (dropped: {dict(dropped)}; "
        f"candidates.min_candidates={plan.candidates.min_candidates}, judge abstentions "
        f"{summary['judge_abstentions']} {summary['judge_abstention_reasons']}). Of {total} candidates, {empty} "
        f"were empty, {duplicates} duplicates and {cut} cut at max_new_tokens, all removed"
    )
    if total and empty == total:
        why += (
            ": the generator answered every prompt with no text (a server's stop strings, a chat template that "
            "ends the turn at once, or max_new_tokens 0); try one prompt by hand"
        )
    return f"{why}. Details in {summary_path}"


def _write_outputs(plan: StagePlan, done: StagesDone, last_run: dict, saturation_band: float) -> PipelineResult:
    """Build data.jsonl and summary.json (with the `last_run` facts) from the shards alone (as
    read back from disk), so a resumed run's outputs cannot depend on what happened in memory
    before the kill. Raises, after writing both, when no prompt gave a training row."""
    method, candidates = plan.method, plan.candidates
    out = Path(candidates.out_dir)
    judged_rows = [r for shard in done.judged for r in shard]
    generated_rows = [r for shard in done.generated for r in shard]
    data, dropped = build_rows(judged_rows, method, keep=candidates.keep, min_candidates=candidates.min_candidates)
    data_path = out / "data.jsonl"
    write_jsonl_atomic(data_path, data)
    summary = summarise(
        generated_rows,
        judged_rows,
        data,
        dropped,
        method=method,
        generate=plan.generate,
        judge=plan.judge,
        candidates=candidates,
        saturation_band=saturation_band,
    )
    summary["truncated_candidates_dropped"] = sum(g.get("truncated_dropped", 0) for g in generated_rows)
    summary["data_sha256"] = file_sha256(data_path)  # what later stages check the file against (`build.data_problem`)
    summary.update(last_run)
    record = CandidatesSummary.model_validate(redact(summary))  # summary.json is pushed to the hub with them
    summary = record.model_dump(mode="json")
    summary_path = out / "summary.json"
    record.write(summary_path, private=True)
    silent = empty_samples_warning(generated_rows, "the generate stage", plan.gen_dir)
    if silent:
        LOG.warning(silent)
    if not data:
        raise ValueError(_no_rows(plan, generated_rows, summary, dropped, summary_path))
    if summary["judge_prompts_cut"]:
        LOG.warning(
            f"POFE: {summary['judge_prompts_cut']} candidates of {summary['judge_rows_with_prompt_cut']} prompts were "
            f"judged with their prompt cut from the left to judge.max_length={plan.judge.max_length} (responses kept "
            "whole); raise judge.max_length to score whole conversations"
        )
    if summary["judge_pairs_order_sum_off"]:
        LOG.warning(order_sum_warning(summary, plan.judge.type, summary_path))
    saturated = record.saturation and record.saturation.warning(f"POFE: {summary_path}")
    if saturated:
        LOG.warning(saturated)
    if summary["rows_with_equal_labels"]:
        LOG.warning(
            f"POFE: {summary['rows_with_equal_labels']} of {len(data)} rows in {data_path} have all-equal "
            f"{method_spec(method).target.noun}: no pair to rank there (the judge cannot tell the candidates apart)"
        )
    return PipelineResult(data_path, summary_path, len(data), summary)


def run_stages(
    plan: StagePlan,
    *,
    owned: list[int] | None = None,
    generator: Generator | None = None,
    judge_impl: ScalarJudge | PairwiseJudge | None = None,
    tokenizer=None,
    stop_after: Literal["generate", "judge"] | None = None,
    workdir: Path | None = None,
) -> StagesDone:
    """The generate stage on the `owned` shards (None: all), then the judge stage on them.

    The generator is built only if a shard needs it, and when built here it is closed and
    dropped before the judge is built: a GPU never holds both models. `workdir`: where the
    generator keeps its own files (a served policy's server.log); None: the generate folder.
    """
    redone: dict[str, int] = {}
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    built = generator is None
    generated, generator = generate_stage(plan, owned, generator, redone, tokenizer, workdir or plan.gen_dir)
    timings["generate_s"] = time.monotonic() - t0
    requests = _request_stats("generate_client", generator)
    if built and generator is not None:
        close_generator(generator)
        generator = None
        free_memory()
    if stop_after == "generate":
        return StagesDone(generated, None, timings, redone, requests)
    t0 = time.monotonic()
    judged, judge_impl = judge_stage(plan, generated, judge_impl, redone, final=owned is None)
    timings["judge_s"] = time.monotonic() - t0
    return StagesDone(generated, judged, timings, redone, {**requests, **_request_stats("judge", judge_impl)})


def _request_stats(name: str, obj) -> dict[str, dict]:
    """An API client's request counts (OpenAI-compatible backends and judges), by stage."""
    client = getattr(obj, "client", None)
    return {name: client.stats.as_dict()} if client is not None and hasattr(client, "stats") else {}


def _check_inputs(
    rows: list[dict], prompt_column: str, generate: GenerateConfig, candidates: CandidatesConfig
) -> None:
    """What can be checked before any model loads: columns, and that k can reach min_candidates."""
    if not rows:
        raise ValueError("run_pipeline got no prompt rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or prompt_column not in r:
            cols = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise KeyError(f"prompt row {i} has no {prompt_column!r} column (columns: {cols})")
    for i, r in enumerate(rows):
        missing = [c for c in generate.include_dataset_responses if c not in r]
        if missing:
            raise ValueError(
                f"generate.include_dataset_responses names {missing}, which prompt row {i} does not have "
                f"(columns: {sorted(r)}); a typo?"
            )
        for c in generate.include_dataset_responses:
            column_texts(r, c, i)  # raises on a value that is not text
    if not generate.include_dataset_responses and generate.num_candidates < candidates.min_candidates:
        raise ValueError(
            f"generate.num_candidates={generate.num_candidates} gives at most {generate.num_candidates} candidate(s) "
            f"per prompt, fewer than candidates.min_candidates={candidates.min_candidates}: every row would be "
            "dropped. Raise num_candidates, or add dataset responses (generate.include_dataset_responses)."
        )


__all__ = ["run_pipeline", "run_stages", "PipelineResult", "SHARD_SEED_STRIDE", "StagesDone"]
