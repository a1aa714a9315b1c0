"""Iterated runs publish per round (`pofe.run.rounds.publish`): hub repos `<id>-iter<t>` pushed through
huggingface_hub's real `HfApi` to a loopback hub, tracker runs named per round, the
round-level numbers read back from an offline W&B run, and one prompt file per round."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from pofe import PofePlugin
from pofe.args import PofeConfig
from pofe.run.folder import RunFolder, RunState
from pofe.run.recipe import load_recipe
from pofe.run.report.collect import sample_rows
from pofe.run.rounds.publish import hub_dataset_repo, log_round_metrics, push_round, round_metrics, tracker_env
from pofe.run.rounds.round_recipe import round_recipe
from pofe.run.rounds.runner import StageRunner
from tests.helpers import prompts_in, prompts_stage, read_wandb_history
from tests.hub_server import HubServer

RAW = {
    "base_model": "/m/base",
    "rl": "rrhf",
    "datasets": [{"path": "data/p.jsonl", "type": "pofe.prompts"}],
    "output_dir": "/runs/tldr-rrhf",
    "hub_model_id": "org/tldr",
    "wandb_project": "pofe",
    "wandb_name": "tldr",
    "trackio_project_name": "pofe",
    "pofe": {
        "rounds": 3,
        "generate": {"backend": "transformers", "seed": 7},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    },
}


def test_round_recipes_name_hub_repos_and_tracker_runs_per_round():
    folder = RunFolder(Path("/runs/tldr-rrhf"))
    full, _ = round_recipe(RAW, folder, 2, "/runs/tldr-rrhf/round-1/train", seed=8)
    # a full fine-tune: axolotl's trainer pushes round 2's model to its own repo
    assert full["hub_model_id"] == "org/tldr-iter2"
    assert full["wandb_name"] == "tldr-iter2" and full["trackio_run_name"] == "tldr-iter2"
    assert tracker_env(RAW) == {"WANDB_RUN_GROUP": "tldr"}
    lora, _ = round_recipe({**RAW, "adapter": "lora"}, folder, 2, "/runs/tldr-rrhf/round-1/merged", seed=8)
    assert "hub_model_id" not in lora  # an adapter: the runner pushes the merged iterate instead
    # no wandb_name: the run is named after its output_dir; a wandb_run_id gets a round suffix
    plain = {k: v for k, v in RAW.items() if k not in ("wandb_name", "trackio_project_name")}
    named, _ = round_recipe({**plain, "wandb_run_id": "abc"}, folder, 3, "/p", seed=9)
    assert named["wandb_name"] == "tldr-rrhf-iter3" and named["wandb_run_id"] == "abc-iter3"
    assert "trackio_run_name" not in named
    off, _ = round_recipe({**plain, "wandb_mode": "disabled", "hub_model_id": None}, folder, 1, "/p", seed=7)
    assert "wandb_name" not in off and "hub_model_id" not in off and tracker_env(off) == {}
    assert hub_dataset_repo(RAW, 2) == "org/tldr-iter2-data"
    assert hub_dataset_repo({**RAW, "pofe": {"hub_dataset_id": "org/cands"}}, 2) == "org/cands-iter2"
    assert hub_dataset_repo(off, 1) is None


def write_round(folder: RunFolder, t: int) -> None:
    cands, merged = folder.candidates(t), folder.merged(t)
    cands.mkdir(parents=True)
    merged.mkdir(parents=True)
    row = {"prompt": f"p{t}", "responses": ["a", "b"], "rewards": [1, 0]}
    (cands / "data.jsonl").write_text(json.dumps(row) + "\n")
    (cands / "summary.json").write_text(json.dumps({"rows": 1}))
    (cands / "shard-00000.jsonl").write_text("not pushed\n")
    (merged / "config.json").write_text('{"model_type": "llama"}')
    (merged / "model.safetensors").write_bytes(bytes(range(256)) * 40)


@pytest.fixture(autouse=True)
def hub_reachable(monkeypatch):
    """The tests run with HF_HUB_OFFLINE=1, which huggingface_hub reads once, at import;
    the loopback hub is the only one these tests reach."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def loopback_hub(monkeypatch):
    """A `HubServer` that `HfApi()` talks to, as HF_ENDPOINT and HF_TOKEN would point it
    (huggingface_hub reads the endpoint once, at import; the token at each call)."""
    from huggingface_hub import constants

    with HubServer() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        yield hub


def test_push_stage_sends_each_rounds_model_and_candidates_to_its_repos(tmp_path, loopback_hub):
    """Through huggingface_hub's HfApi to a loopback hub: round t's candidates go to
    `org/tldr-iter<t>-data` as data/train.jsonl (+ pofe/summary.json), its merged iterate to
    `org/tldr-iter<t>`, byte for byte, private; a finished push stage is not redone."""
    folder = RunFolder(tmp_path)
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="rrhf")
    said = []
    runner = StageRunner(state, echo=said.append)
    hub = loopback_hub
    for t in (1, 2):
        write_round(folder, t)
        push_round({**RAW, "adapter": "lora"}, folder, t, True, runner)
    push_round({**RAW, "adapter": "lora"}, folder, 2, True, runner)  # done: skipped
    assert hub.unknown == []
    assert len(hub.commits) == 4
    for t in (1, 2):
        cands, merged = folder.candidates(t), folder.merged(t)
        assert hub.created[f"org/tldr-iter{t}-data"] == {"type": "dataset", "visibility": "private"}
        assert hub.created[f"org/tldr-iter{t}"] == {"type": "model", "visibility": "private"}
        assert hub.files[("dataset", f"org/tldr-iter{t}-data")] == {
            "data/train.jsonl": (cands / "data.jsonl").read_bytes(),
            "pofe/summary.json": (cands / "summary.json").read_bytes(),
        }
        assert hub.files[("model", f"org/tldr-iter{t}")] == {p.name: p.read_bytes() for p in merged.iterdir()}
        record = state.stages[f"round-{t}/push"]
        assert record["status"] == "done" and record["model"][0] == f"org/tldr-iter{t}"
        assert record["dataset"][1].startswith(f"{hub.url}/org/tldr-iter{t}-data/commit/")
    assert said[0] == "round 1: push the candidates to the dataset repo org/tldr-iter1-data"


def test_full_fine_tune_pushes_only_the_candidates(tmp_path, loopback_hub):
    """Without an adapter axolotl's trainer pushed the model; the runner sends the data only,
    to `pofe.hub_dataset_id`'s repo; a recipe with neither key pushes nothing."""
    folder = RunFolder(tmp_path)
    state = RunState.open(folder.state, fingerprint="a", recipe="r.yml", method="rrhf")
    write_round(folder, 1)
    raw = {**RAW, "pofe": {**RAW["pofe"], "hub_dataset_id": "org/cands"}}
    hub = loopback_hub
    runner = StageRunner(state)
    push_round(raw, folder, 1, False, runner)
    push_round({**RAW, "hub_model_id": None}, folder, 2, False, runner)
    assert list(hub.created) == ["org/cands-iter1"] and "round-2/push" not in state.stages
    assert list(hub.files) == [("dataset", "org/cands-iter1")] and len(hub.commits) == 1


REPORT = {
    "rounds": [
        {
            "round": 1,
            "candidates": {
                "mean_reward": 0.25,
                "best_of_k_reward": 0.75,
                "policy_sample_mean_reward": 0.5,
                "mean_best_win_rate": None,
                "win_rate_spread": None,
            },
            "train": {"first_loss": 2.0, "last_loss": 1.5},
            "trained_on_train_prompts": {
                "model_mean_reward": 0.5,
                "candidates_best_of_k_reward": 0.75,
                "samples": [
                    {
                        "index": 0,
                        "sample": 0,
                        "prompt": "1+1=",
                        "completion": "2",
                        "reward": 1.0,
                        "best_candidate": "2",
                        "best_candidate_reward": 1.0,
                    },
                    {
                        "index": 1,
                        "sample": 0,
                        "prompt": "2+2=",
                        "completion": "5",
                        "reward": 0.0,
                        "best_candidate": "4",
                        "best_candidate_reward": 1.0,
                    },
                ],
            },
        },
        {
            "round": 2,
            "candidates": {"mean_reward": 0.5, "best_of_k_reward": 1.0, "policy_sample_mean_reward": 0.625},
            "train": None,
        },
    ],
    "eval": {
        "models": [{"name": "pi_0"}, {"name": "pi_1"}, {"name": "pi_2"}],
        "mean_reward": [0.125, 0.375, 0.625],
        "mean_reward_judge2": None,
        "kl_to_pi_0": [0.0, 0.5, 1.25],
        "perplexity": None,
        "mean_response_tokens": [4.0, 3.5, 3.0],
        "win_matrix": [[0.5, 0.25, 0.125], [0.75, 0.5, 0.375], [0.875, 0.625, 0.5]],
        "vs_pi_0": [None, {"lc": 0.5625}, {"lc": 0.6875}],
        "vs_previous": [None, {"lc": 0.5625}, {"lc": 0.4375}],
        "best_of_k": [{"round": 1, "best_of_k_reward": 0.25}, {"round": 2, "best_of_k_reward": 0.5}],
    },
}


def test_round_numbers_reach_wandb(tmp_path, monkeypatch):
    """An offline W&B run `<name>-rounds` in group `<name>` holds, at step t, round t's numbers
    from the report (step 0: pi_0's held-out numbers); None values are left out."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = round_metrics(REPORT)
    run_id = log_round_metrics({**RAW, "wandb_mode": "offline"}, rows, tmp_path, sample_rows(REPORT))
    (run_dir,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    deadline = time.monotonic() + 60
    while not (found := read_wandb_history(run_dir))[2]:  # wandb's service may still be writing
        assert time.monotonic() < deadline, "the offline run never got its exit record"
        time.sleep(0.2)
    run, history, _ = found
    assert run == {"name": "tldr-rounds", "group": "tldr", "id": run_id}
    table_ref = {k.removeprefix("samples/"): history[2].pop(k) for k in list(history[2]) if k.startswith("samples/")}
    assert (table_ref["_type"], table_ref["nrows"], table_ref["ncols"]) == ("table-file", 2, 8)
    assert history == {
        0: {"eval/mean_reward": 0.125, "eval/kl_to_pi_0": 0.0, "eval/mean_response_tokens": 4.0},
        1: {
            "headline/trained_reward": 0.5,
            "headline/best_of_k_reward": 0.75,
            "candidates/mean_reward": 0.25,
            "candidates/best_of_k_reward": 0.75,
            "candidates/policy_sample_mean_reward": 0.5,
            "train/first_loss": 2.0,
            "train/last_loss": 1.5,
            "eval/mean_reward": 0.375,
            "eval/kl_to_pi_0": 0.5,
            "eval/mean_response_tokens": 3.5,
            "eval/win_rate_vs_pi_0": 0.75,
            "eval/win_rate_vs_previous": 0.75,
            "eval/lc_win_rate_vs_pi_0": 0.5625,
            "eval/lc_win_rate_vs_previous": 0.5625,
            "eval/held_out_best_of_k_reward": 0.25,
        },
        2: {
            "candidates/mean_reward": 0.5,
            "candidates/best_of_k_reward": 1.0,
            "candidates/policy_sample_mean_reward": 0.625,
            "eval/mean_reward": 0.625,
            "eval/kl_to_pi_0": 1.25,
            "eval/mean_response_tokens": 3.0,
            "eval/win_rate_vs_pi_0": 0.875,
            "eval/win_rate_vs_previous": 0.625,
            "eval/lc_win_rate_vs_pi_0": 0.6875,
            "eval/lc_win_rate_vs_previous": 0.4375,
            "eval/held_out_best_of_k_reward": 0.5,
        },
    }
    # the sampled completions: one table at the last step, its rows as the report has them
    (table_file,) = run_dir.glob("files/media/table/samples_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == [
        "round",
        "index",
        "sample",
        "prompt",
        "completion",
        "reward",
        "best_candidate",
        "best_candidate_reward",
    ]
    assert table["data"] == [[1, 0, 0, "1+1=", "2", 1.0, "2", 1.0], [1, 1, 0, "2+2=", "5", 0.0, "4", 1.0]]


def test_one_prompt_file_per_round(tmp_path):
    """`pofe.round_prompts: [f1, f2]`: round t trains on file t; the datasets entry gives only
    the held-out rows (its last eval.held_out); wrong counts and missing files name the round,
    the missing files when the recipe is loaded."""
    files = []
    for t in (1, 2):
        path = tmp_path / f"iter{t}.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"r{t}-{i}"}) + "\n" for i in range(t + 1)))
        files.append(str(path))
    base = tmp_path / "base.jsonl"
    base.write_text("".join(json.dumps({"prompt": f"b{i}"}) + "\n" for i in range(5)))
    pofe = {**RAW["pofe"], "rounds": 2, "round_prompts": files, "eval": {"held_out": 2}}
    folder, state, said = prompts_stage(tmp_path, "rrhf", base, pofe)
    assert prompts_in(folder.round_prompts(1)) == ["r1-0", "r1-1"]
    assert prompts_in(folder.round_prompts(2)) == ["r2-0", "r2-1", "r2-2"]
    assert prompts_in(folder.held_out_prompts) == ["b3", "b4"]
    assert state.prompt_mode == "files"
    assert said == ["prompts: 5 for training (files over 2 round(s)), 2 held out"]
    with pytest.raises(ValueError, match="lists 2 prompt sets for pofe.rounds: 3"):
        PofeConfig(rounds=3, round_prompts=files)
    # files on disk are checked once, where a recipe is loaded, not at every read of the block
    missing = {**RAW, "pofe": {**RAW["pofe"], "rounds": 2, "round_prompts": [files[0], str(tmp_path / "gone.jsonl")]}}
    assert PofeConfig(**missing["pofe"]).round_prompts[1].endswith("gone.jsonl")
    gone = r"round_prompts\[1\] \(round 2\): no file at '.*gone.jsonl'"
    with pytest.raises(ValueError, match=gone):
        PofePlugin().register(dict(missing))
    recipe_path = tmp_path / "recipe.yml"
    recipe_path.write_text(yaml.safe_dump({**missing, "plugins": ["pofe.PofePlugin"]}))
    with pytest.raises(ValueError, match=gone):
        load_recipe(recipe_path)  # axolotl's load_cfg runs register
