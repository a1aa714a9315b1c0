"""Data-parallel candidates: the generate and judge shards split over worker processes.

Shard s belongs to worker s % num_workers (`owned_shards`). `run_pipeline` verifies the
manifests and removes what a killed run left, then starts the workers (`run_workers`:
`python -m pofe_candidates.worker`), each on its own devices (`assign_devices`), each
writing only its own shards with the stages' atomic writers; it waits for all of them and
builds data.jsonl from the shards, as one process would. Seeds are per shard, so the file is
byte for byte the one-process one (same thread count and device kind: float sums depend on
them). A worker that fails fails the run, naming the worker and its log; the shards it and
the others finished stay, and a rerun redoes only the missing ones.

vLLM's own parallel settings pass through `generate.vllm_kwargs`: tensor_parallel_size and
pipeline_parallel_size split one engine over tensor_parallel_size x pipeline_parallel_size
GPUs, so each worker gets a group of that many (a served policy: serve.tensor_parallel_size;
each worker starts its own server, on a free port, its log in workers/worker-N/). vLLM's
data_parallel_size is refused: its in-process `vllm.LLM` cannot run it (it asks for one
process per rank), which is what num_workers is.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

from pofe.errors import PofeError
from pofe.files import write_atomic
from pofe.logs import logger_name
from pofe_candidates.config import CandidatesConfig, GenerateConfig
from pofe_candidates.shard_work import StagePlan

LOG = logging.getLogger(logger_name(__name__))
WORKER_MODULE = "pofe_candidates.worker"
LOG_TAIL_LINES = 30


class WorkerFailed(PofeError, RuntimeError):
    """A candidate worker process exited with an error (or was killed)."""


def owned_shards(worker: int, num_workers: int, n_shards: int) -> list[int]:
    """The shards worker `worker` of `num_workers` generates and judges: s % num_workers == worker."""
    return list(range(worker, n_shards, num_workers))


def engine_group_size(generate: GenerateConfig) -> int:
    """GPUs one generator needs: vLLM's tensor_parallel_size x pipeline_parallel_size (in
    process), a served policy's serve.tensor_parallel_size, else 1."""
    if generate.serve is not None:
        return generate.serve.tensor_parallel_size
    if generate.backend != "vllm":
        return 1
    kw = generate.vllm_kwargs
    return int(kw.get("tensor_parallel_size", 1)) * int(kw.get("pipeline_parallel_size", 1))


def check_parallel(generate: GenerateConfig, candidates: CandidatesConfig, *, prebuilt: list[str]) -> None:
    """What cannot run, said before any model loads. `prebuilt`: the objects the caller passed
    in (a worker process builds its own from the config, so there are none to share)."""
    if generate.backend == "vllm" and int(generate.vllm_kwargs.get("data_parallel_size", 1)) > 1:
        raise ValueError(
            f"generate.vllm_kwargs.data_parallel_size={generate.vllm_kwargs['data_parallel_size']}: vllm.LLM "
            "runs one data-parallel rank per process, so POFE runs the ranks itself: set "
            "pofe.candidates.num_workers instead (each worker its own engine on its own GPUs)"
        )
    if candidates.num_workers > 1 and prebuilt:
        raise ValueError(
            f"run_pipeline got a pre-built {' and '.join(prebuilt)} with candidates.num_workers="
            f"{candidates.num_workers}: worker processes build theirs from the config; pass none, or use one worker"
        )
    if candidates.num_workers > 1 and generate.serve is not None and generate.serve.port != 0:
        raise ValueError(
            f"generate.serve.port={generate.serve.port} with candidates.num_workers={candidates.num_workers}: "
            "each worker starts its own server, and they cannot share a port; set port: 0 (a free one each)"
        )
    group = engine_group_size(generate)
    for i, devices in enumerate(candidates.worker_devices or []):
        if len(devices.split(",")) != group:
            raise ValueError(
                f"pofe.candidates.worker_devices[{i}] = {devices!r} names {len(devices.split(','))} GPU(s), but "
                f"each worker's generator needs {group} (vLLM's tensor_parallel_size x pipeline_parallel_size)"
            )


def visible_gpus() -> list[str]:
    """This process's GPUs as CUDA_VISIBLE_DEVICES names them (indices or UUIDs); [] on a CPU."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def assign_devices(num_workers: int, assigned: list[str] | None, group: int, visible: list[str]) -> list[str | None]:
    """Each worker's CUDA_VISIBLE_DEVICES (None: leave it as it is, a CPU run).

    As `assigned`, when given. Else with one GPU per generator, worker i takes visible[i % G]
    (more workers than GPUs share them, as small models can); with a group of `group` GPUs
    per generator (vLLM tensor or pipeline parallel), worker i takes the i-th run of `group`
    consecutive visible GPUs, and there must be enough of them.
    """
    if assigned is not None:
        return list(assigned)
    if not visible:
        if group > 1:
            raise ValueError(
                f"each generator needs {group} GPUs (tensor_parallel_size x pipeline_parallel_size) but none is visible"
            )
        return [None] * num_workers
    if group == 1:
        return [visible[i % len(visible)] for i in range(num_workers)]
    if num_workers * group > len(visible):
        raise ValueError(
            f"{num_workers} workers x {group} GPUs each (tensor_parallel_size x pipeline_parallel_size) need "
            f"{num_workers * group} GPUs, {len(visible)} are visible ({','.join(visible)}): lower "
            "pofe.candidates.num_workers, or assign groups in pofe.candidates.worker_devices"
        )
    return [",".join(visible[i * group : (i + 1) * group]) for i in range(num_workers)]


def worker_devices(generate: GenerateConfig, candidates: CandidatesConfig) -> list[str | None]:
    """Each worker's CUDA_VISIBLE_DEVICES for these settings on this machine (raises, before
    any worker starts, when the GPUs cannot hold the workers' engines)."""
    return assign_devices(
        candidates.num_workers, candidates.worker_devices, engine_group_size(generate), visible_gpus()
    )


def worker_env(devices: str | None, num_workers: int) -> dict[str, str]:
    """A worker's environment: its GPUs; on a CPU an equal share of the cores (unless
    OMP_NUM_THREADS is set); and this process's import path, so judge.function and the
    tests' modules import there as they do here."""
    env = dict(os.environ)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    elif "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // num_workers))
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def run_workers(
    plan: StagePlan, tokenizer, stop_after: str | None, n_shards: int, devices: list[str | None]
) -> list[dict]:
    """Run the generate and judge stages in `plan.candidates.num_workers` processes, worker i
    on devices[i]; return each worker's report (its shards, devices, timings, shards redone).
    Raises WorkerFailed naming every worker that failed, its exit status and its log's end."""
    n = plan.candidates.num_workers
    folder = plan.gen_dir.parent / "workers"
    folder.mkdir(exist_ok=True)
    spec = folder / "spec.pkl"
    try:
        blob = pickle.dumps({"plan": plan, "tokenizer": tokenizer, "stop_after": stop_after})
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise TypeError(f"candidate workers need the prompts and the tokenizer to pickle: {e}") from e
    spec.write_bytes(blob)
    procs: list[tuple[int, subprocess.Popen, Path]] = []
    LOG.info(f"POFE: {n} candidate workers on devices {devices}; logs in {folder}")
    try:
        for i in range(n):
            (folder / f"worker-{i}.json").unlink(missing_ok=True)
            log = folder / f"worker-{i}.log"
            cmd = [sys.executable, "-m", WORKER_MODULE, str(spec), str(i), str(os.getpid())]
            with log.open("w", encoding="utf-8") as f:
                p = subprocess.Popen(
                    cmd, env=worker_env(devices[i], n), stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT
                )
            procs.append((i, p, log))
        while any(p.poll() is None for _, p, _ in procs):
            time.sleep(0.2)
    finally:
        for _, p, _ in procs:  # an exception here (Ctrl-C): the workers end with this process
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [
        _failure(i, n, p.returncode, log, devices[i], owned_shards(i, n, n_shards))
        for i, p, log in procs
        if p.returncode != 0
    ]
    if failed:
        raise WorkerFailed(
            "\n\n".join(failed) + "\n\nThe shards every worker finished are kept: run again to redo only the rest."
        )
    return [json.loads((folder / f"worker-{i}.json").read_text()) for i in range(n)]


def write_report(folder: Path, worker: int, report: dict) -> None:
    write_atomic(folder / f"worker-{worker}.json", json.dumps(report, sort_keys=True) + "\n")


def _failure(i: int, n: int, returncode: int, log: Path, devices: str | None, shards: list[int]) -> str:
    how = f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with {returncode}"
    tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-LOG_TAIL_LINES:])
    where = f"CUDA_VISIBLE_DEVICES={devices}" if devices is not None else "CPU"
    return f"candidate worker {i} of {n} ({where}, shards {shards}) {how}; its log: {log}; last lines:\n{tail}"
