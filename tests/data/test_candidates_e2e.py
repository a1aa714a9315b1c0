"""Prompts -> `axolotl preprocess` (generate + judge) -> `axolotl train`, on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from pofe.demo.task import answer, make_prompt_rows, reward, write_jsonl
from pofe_candidates import bradley_terry_preferences, win_rates
from tests.helpers import ROOT, log_history, pofe_block, prompts_file, recipe, run_axolotl

pytestmark = pytest.mark.e2e


@pytest.mark.newest
@pytest.mark.parametrize("method", ["rrhf", "sppo"])
def test_prompts_to_trained_model(tmp_path, tiny_model, method):
    data, prompts = prompts_file(tmp_path)
    cfg = recipe(
        tmp_path,
        tiny_model,
        method,
        data,
        "pofe.prompts",
        pofe=pofe_block(method),
        micro_batch_size=4,
        learning_rate=1e-3,
    )
    console = run_axolotl("preprocess", str(cfg)).stdout.splitlines()

    (cand_dir,) = (tmp_path / "prepared").glob("pofe-candidates-*")
    (prepared,) = (p for p in (tmp_path / "prepared").glob("pofe-*") if p != cand_dir)
    rows = [json.loads(line) for line in (cand_dir / "data.jsonl").read_text().splitlines()]
    summary = json.loads((cand_dir / "summary.json").read_text())
    assert summary["rows"] == len(rows) > 0
    # the console ends with POFE's verdict, after axolotl's last line: 3 candidates sampled, the
    # answer joins them (4 judged a prompt; dedupe may drop some), one verdict each, none abstained
    ks = [len(r["responses"]) for r in rows]
    labels = [r["rewards" if method == "rrhf" else "win_rates"] for r in rows]
    per_prompt = f"{ks[0]}" if len(set(ks)) == 1 else f"{sum(ks) / len(ks):.2f} (min {min(ks)}, max {max(ks)})"
    success = max(i for i, line in enumerate(console) if "Success! Preprocessed data path" in line)
    said = [line[line.index("POFE: ") :] for line in console[success + 1 :]]
    if method == "rrhf":
        flat = [x for r in labels for x in r]
        label_line = (
            f"POFE: rewards of the prepared candidates: mean {sum(flat) / len(flat):.3f}, "
            f"best-of-k {sum(max(r) for r in labels) / len(labels):.3f}"
        )
    else:
        label_line = (
            f"POFE: win rates of the prepared candidates: the best's {sum(max(r) for r in labels) / len(labels):.3f} "
            f"on average, spread {sum(max(r) - min(r) for r in labels) / len(labels):.3f}"
        )
    assert said == [
        f"POFE: prepared {len(rows)} rows for rl: {method}, {per_prompt} candidates per prompt, in {prepared}",
        f"POFE: {data}: {len(rows)} of {len(prompts)} prompts have candidates (dropped: none); the judge gave "
        f"{sum(ks)} verdicts and abstained on 0; in {cand_dir}",
        label_line,
        f"POFE: next, train: axolotl train {cfg}",
    ]
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in prompts][: len(rows)]
    for row in rows:
        # the reference answer is among the candidates, and scores are aligned with them
        assert str(answer(row["prompt"])) in row["responses"]
        rewards = [reward(row["prompt"], r) for r in row["responses"]]
        if method == "rrhf":
            assert row["rewards"] == pytest.approx(rewards)
        else:
            expected = win_rates(bradley_terry_preferences(torch.tensor(rewards, dtype=torch.float64)))
            assert row["win_rates"] == pytest.approx(expected.tolist(), abs=1e-6)
    assert summary["mean_best_of_k_reward"] == pytest.approx(1.0)

    proc = run_axolotl("train", str(cfg))
    assert "Loading prepared dataset from disk" in proc.stdout + proc.stderr
    steps = [h for h in log_history(tmp_path / "out") if "loss" in h]
    assert len(steps) == -(-len(rows) // 4)
    assert all(f"{method}/" in " ".join(h) for h in steps)


def test_axolotl_pofe_candidates_runs_stages_apart(tmp_path, tiny_model):
    data, prompts = prompts_file(tmp_path)
    cfg = recipe(tmp_path, tiny_model, "rrhf", data, "pofe.prompts", pofe=pofe_block("rrhf"))
    run_axolotl("pofe", "candidates", str(cfg), "--stage", "generate")
    (cand_dir,) = (tmp_path / "prepared").glob("pofe-candidates-*")
    generated = sorted((cand_dir / "generate").glob("shard-*.jsonl"))
    assert generated and not list((cand_dir / "judge").glob("shard-*.jsonl"))
    assert not (cand_dir / "data.jsonl").exists()
    before = [p.stat().st_mtime_ns for p in generated]

    proc = run_axolotl("pofe", "candidates", str(cfg))
    # generation is not redone: the shards are untouched; judging and building follow
    assert [p.stat().st_mtime_ns for p in generated] == before
    rows = [json.loads(line) for line in (cand_dir / "data.jsonl").read_text().splitlines()]
    assert f"{data}: {len(rows)} rows -> {cand_dir / 'data.jsonl'}" in proc.stdout
    assert len(rows) == len(prompts)


def test_the_two_tiny_recipes_share_a_prepared_path(tmp_path, tiny_model):
    """Issue 34: `tiny-rrhf-cpu.yml` and `tiny-sppo-cpu.yml` name one dataset_prepared_path;
    preprocessing the SPPO one after the RRHF one stopped on a ManifestMismatch (their
    candidate folder was named before the per-method dedupe default was filled in). The
    shipped recipes as they are, their paths pointed into tmp_path and 8 prompts: each
    preprocess writes its own folder, of its own method's rows."""
    rows = make_prompt_rows(8, k_wrong=3, seed=0)
    data = write_jsonl(rows, tmp_path / "prompts.jsonl")
    paths = {}
    for method in ("rrhf", "sppo"):
        raw = yaml.safe_load((ROOT / "recipes" / f"tiny-{method}-cpu.yml").read_text())
        raw.update(base_model=str(tiny_model), output_dir=str(tmp_path / method))
        raw.update(
            dataset_prepared_path=str(tmp_path / "prepared"), datasets=[{**raw["datasets"][0], "path": str(data)}]
        )
        paths[method] = tmp_path / f"{method}.yml"
        paths[method].write_text(yaml.safe_dump(raw))
    for method in ("rrhf", "sppo"):
        run_axolotl("preprocess", str(paths[method]))
    folders = sorted((tmp_path / "prepared").glob("pofe-candidates-*"))
    assert len(folders) == 2
    summaries = sorted((json.loads((f / "summary.json").read_text()) for f in folders), key=lambda s: s["method"])
    assert [s["method"] for s in summaries] == ["rrhf", "sppo"]
    assert [s["rows"] for s in summaries] == [8, 8]


def test_preprocess_of_an_online_recipe_ends_saying_it_samples_as_it_trains(tmp_path, tiny_model):
    """Issue 49: `axolotl preprocess` of the shipped online recipe ended at axolotl's own lines. Its
    candidates are sampled as it trains: the console ends with the prompts it checked (the 8 rows
    written here, none held out) and the command that trains."""
    data = write_jsonl(make_prompt_rows(8, k_wrong=3, seed=0), tmp_path / "prompts.jsonl")
    raw = yaml.safe_load((ROOT / "recipes" / "tiny-rrhf-online-cpu.yml").read_text())
    raw.update(base_model=str(tiny_model), output_dir=str(tmp_path / "out"))
    raw.update(dataset_prepared_path=str(tmp_path / "prepared"), datasets=[{**raw["datasets"][0], "path": str(data)}])
    cfg = tmp_path / "online.yml"
    cfg.write_text(yaml.safe_dump(raw))
    console = run_axolotl("preprocess", str(cfg)).stdout.splitlines()
    success = max(i for i, line in enumerate(console) if "Success! Preprocessed data path" in line)
    assert [line[line.index("POFE: ") :] for line in console[success + 1 :]] == [
        "POFE: 8 prompts checked; nothing to prepare ahead: an online recipe samples its candidates from the "
        "policy as it trains",
        f"POFE: next, train: axolotl train {cfg}",
    ]
