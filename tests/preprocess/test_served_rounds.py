"""`axolotl pofe run`, two RRHF rounds, generating through generate.serve: each round starts
a vLLM (CPU) server for its own policy from .venv-vllm, and stops it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import run_axolotl
from tests.test_rounds_e2e import read_jsonl, write_recipe

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def _serve_block(vllm_python: Path) -> dict:
    from tests.vllm_server import VLLM_CPU_ENV, vllm_cpu_command

    return {"command": vllm_cpu_command(vllm_python), "env": VLLM_CPU_ENV, "ready_timeout": 400, "stop_timeout": 20}


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                pass  # ended meanwhile
    return pids


def test_two_rounds_each_serve_their_policy(vllm_python, tiny_model, tmp_path):
    from pofe.preprocess import GenerateConfig, JudgeConfig, PipelineConfig, run_pipeline

    recipe = write_recipe(tmp_path, tiny_model, "rrhf")
    raw = yaml.safe_load(recipe.read_text())
    # one request at a time: what vLLM batches together changes its float sums, so the samples
    raw["pofe"]["generate"].update(backend="openai", serve=_serve_block(vllm_python), in_flight=1)
    recipe.write_text(yaml.safe_dump(raw))
    run_axolotl("pofe", "run", str(recipe), "--launcher", "python", "--quiet")

    run = tmp_path / "run"
    policies = {1: str(tiny_model), 2: str(run / "round-1" / "train")}
    for t, policy in policies.items():
        candidates = run / f"round-{t}" / "candidates"
        log = (candidates / "generate" / "server.log").read_text()
        assert log.count("=== POFE") == 1 and f"--model {policy} " in log  # one server, this round's policy
        summary = json.loads((candidates / "summary.json").read_text())
        assert summary["generate_client_requests_last_run"]["failures"] == 0
    assert _processes_naming(str(run)) == []  # every server stopped with its stage

    # round 2's candidates, generated again from round 1's model with round 2's settings
    r2 = yaml.safe_load((run / "round-2" / "recipe.yml").read_text())
    again = tmp_path / "again"
    run_pipeline(read_jsonl(run / "prompts" / "round-2.jsonl"), policy_path=policies[2], method="rrhf",
                 generate=GenerateConfig(**r2["pofe"]["generate"]), judge=JudgeConfig(**r2["pofe"]["judge"]),
                 candidates=PipelineConfig(out_dir=str(again), progress=False), stop_after="generate")

    def shards(d: Path) -> list[list[str]]:
        return [r["candidates"] for p in sorted((d / "generate").glob("shard-*.jsonl")) for r in read_jsonl(p)]

    assert shards(again) == shards(run / "round-2" / "candidates")
