"""`axolotl pofe run`, two RRHF rounds, generating through generate.serve: each round starts
a vLLM (CPU) server for its own policy from .venv-vllm, and stops it; so does evaluation,
one server per model of the run (`pofe.eval.backend: auto`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pofe.files import read_jsonl
from tests.helpers import run_axolotl, run_state, write_rounds_recipe

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
    from pofe_candidates import CandidatesConfig, GenerateConfig, JudgeConfig, run_pipeline

    recipe = write_rounds_recipe(tmp_path, tiny_model, "rrhf")
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
    run_pipeline(
        read_jsonl(run / "prompts" / "round-2.jsonl"),
        policy_path=policies[2],
        method="rrhf",
        generate=GenerateConfig(**r2["pofe"]["generate"]),
        judge=JudgeConfig(**r2["pofe"]["judge"]),
        candidates=CandidatesConfig(out_dir=str(again), progress=False),
        stop_after="generate",
    )

    def shards(d: Path) -> list[list[str]]:
        return [r["candidates"] for p in sorted((d / "generate").glob("shard-*.jsonl")) for r in read_jsonl(p)]

    assert shards(again) == shards(run / "round-2" / "candidates")
    _check_eval_answers_came_from_vllm(run, vllm_python, tmp_path)


def _check_eval_answers_came_from_vllm(run: Path, vllm_python: Path, tmp_path: Path) -> None:
    """Each model answered the held-out prompts on a server of its own; pi_1's answers are
    those a vLLM server of pi_1 gives for the prompt's chat-templated ids with the seed
    `pofe.eval.seed + i`, asked here directly (token ids and text), and their log-probs in
    samples.jsonl are pi_1's (transformers) of those ids."""
    import httpx
    from transformers import AutoTokenizer

    from pofe.run.evaluation.answers import sequence_logps
    from pofe_candidates.models import load_policy
    from tests.vllm_server import vllm_server

    st = run_state(run)
    paths = {"pi_0": st.get("pi_0", st["base_model"]), **{f"pi_{t}": r["policy_out"] for t, r in st["rounds"].items()}}
    assert len(paths) == 3
    for name, path in paths.items():
        log = (run / "eval" / "engine" / name / "server.log").read_text()
        assert log.count("=== POFE") == 1 and f"--model {path} " in log, name

    ecfg = yaml.safe_load((run.parent / "recipe.yml").read_text())["pofe"]["eval"]
    records = [r for r in read_jsonl(run / "eval" / "samples.jsonl") if r["model"] == "pi_1"]
    prompts = [r["prompt"] for r in records if r["sample"] == 0]
    assert len(prompts) == ecfg["held_out"] and len(records) == ecfg["held_out"] * ecfg["num_samples"]
    tok = AutoTokenizer.from_pretrained(paths["pi_1"])
    ids = [
        tok.apply_chat_template(
            [{"role": "user", "content": p}] if isinstance(p, str) else p, add_generation_prompt=True
        )["input_ids"]
        for p in prompts
    ]
    with vllm_server(vllm_python, paths["pi_1"], tmp_path / "direct.log") as base:
        direct = [
            httpx.post(
                f"{base}/completions",
                timeout=60,
                json={
                    "model": paths["pi_1"],
                    "prompt": prompt_ids,
                    "n": ecfg["num_samples"],
                    "max_tokens": ecfg["max_new_tokens"],
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "seed": i,
                    "return_token_ids": True,
                },
            ).json()["choices"]
            for i, prompt_ids in enumerate(ids)
        ]
    direct = [sorted(choices, key=lambda c: c["index"]) for choices in direct]
    assert [r["response"] for r in records] == [c["text"] for choices in direct for c in choices]
    assert [r["tokens"] for r in records] == [len(c["token_ids"]) for choices in direct for c in choices]
    pairs = [(prompt_ids, c["token_ids"]) for prompt_ids, choices in zip(ids, direct) for c in choices]
    logps = sequence_logps(load_policy(paths["pi_1"]), [p for p, _ in pairs], [r for _, r in pairs])
    atol = 1e-4 * max(1, max(len(r) for _, r in pairs))  # float32 sums over a few tokens, two runs of one model
    assert [r["logp"] for r in records] == pytest.approx(logps, abs=atol)
