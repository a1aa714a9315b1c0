"""pi_avg (`pofe.run.evaluation.average`): the iterates' weights averaged, tensor by tensor,
checked against transformers' own state dicts averaged in float64."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from pofe.demo.tiny import build_tiny_model
from pofe.run.evaluation.average import AverageError, average_weights


def _state(path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


def _iterates(tmp_path, seeds=(1, 2, 3), **save) -> list[tuple[str, object]]:
    """Tiny models of one architecture (hidden 64), different weights, saved as rounds save them
    (`save`: save_pretrained's options, e.g. a small max_shard_size for a sharded layout)."""
    out = []
    for t, seed in enumerate(seeds, start=1):
        path = build_tiny_model(tmp_path / f"pi_{t}", hidden_size=64, seed=seed)
        if save:
            AutoModelForCausalLM.from_pretrained(path).save_pretrained(path, **save)
        out.append((f"pi_{t}", path))
    return out


@pytest.mark.parametrize("sharded", [False, True])
def test_pi_avg_is_the_mean_of_the_iterates_weights(tmp_path, one_torch_thread, sharded):
    """Three iterates: every tensor of pi_avg (loaded by transformers) equals the mean of the three
    state dicts computed in float64, to float32's rounding of a 3-term sum and a division: within
    2 eps of the mean of the terms' magnitudes, element by element (where the terms cancel, the
    error is relative to them, not to the small mean; measured: 1.13 eps at most); the config and
    tokenizer come along, so it loads and generates like an iterate. Sharded iterates
    (model.safetensors.index.json) give a sharded pi_avg in the same layout."""
    iterates = _iterates(tmp_path, **({"max_shard_size": "200KB"} if sharded else {}))
    if sharded:
        assert (iterates[0][1] / "model.safetensors.index.json").exists()
    said = []
    out = average_weights(iterates, tmp_path / "eval" / "pi_avg", said.append)
    states = [_state(path) for _, path in iterates]
    averaged = _state(out)
    assert averaged.keys() == states[0].keys()
    eps = torch.finfo(torch.float32).eps
    for name, value in averaged.items():
        expected = sum(s[name].double() for s in states) / 3
        bound = 2 * eps * sum(s[name].double().abs() for s in states) / 3
        assert bool(((value.double() - expected).abs() <= bound).all()), name
    # not a copy of one iterate: pi_avg differs from each
    assert all(not torch.equal(averaged["lm_head.weight"], s["lm_head.weight"]) for s in states)
    assert (out / "tokenizer_config.json").exists() and (out / "config.json").exists()
    assert (out / "model.safetensors.index.json").exists() == sharded
    assert json.loads((out / "pofe-average.json").read_text())["of"] == ["pi_1", "pi_2", "pi_3"]
    assert said == [f"eval: pi_avg = the mean of pi_1, pi_2, pi_3's weights -> {out}"]


def test_pi_avg_is_rebuilt_only_when_an_iterate_changes(tmp_path, one_torch_thread):
    """Same iterates, same weights: the folder is kept (its files untouched, so evaluation's stored
    answers of pi_avg stay valid). New weights in pi_2: rebuilt, and the mean follows them."""
    iterates = _iterates(tmp_path, seeds=(1, 2))
    out = average_weights(iterates, tmp_path / "pi_avg", lambda _: None)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    said = []
    average_weights(iterates, out, said.append)
    assert said == [f"eval: pi_avg (pi_1, pi_2) unchanged in {out}"]
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    build_tiny_model(iterates[1][1], hidden_size=64, seed=7)  # round 2 trained again
    average_weights(iterates, out, said.append)
    expected = (_state(iterates[0][1])["lm_head.weight"] + _state(iterates[1][1])["lm_head.weight"]) / 2
    torch.testing.assert_close(_state(out)["lm_head.weight"], expected)
    assert not (tmp_path / "pi_avg.tmp").exists()


def test_iterates_that_do_not_average_are_refused(tmp_path):
    """Another architecture (hidden 128 against 64: other shapes, here the same names) and a
    folder without safetensors weights: refused by name, saying what to do."""
    small = build_tiny_model(tmp_path / "small", hidden_size=64, seed=1)
    wide = build_tiny_model(tmp_path / "wide", hidden_size=128, seed=1)
    with pytest.raises(AverageError, match="differs in shape between iterates"):
        average_weights([("pi_1", small), ("pi_2", wide)], tmp_path / "pi_avg")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(AverageError, match=r"bare holds no model.safetensors .*save_safetensors: true"):
        average_weights([("pi_1", small), ("pi_2", bare)], tmp_path / "pi_avg")


def test_pi_avg_is_evaluated_like_an_iterate(tmp_path, one_torch_thread):
    """A real `axolotl pofe eval` pass (`evaluate_run`, no training: the iterates pi_1, pi_2 are
    tiny models of other seeds) with `pofe.eval.average_iterates`: pi_avg is built from pi_1 and
    pi_2, answers the held-out prompts, is scored under pi_0 for its KL and joins the 4 x 4
    win-rate matrix; eval.json's `average` names it, samples.jsonl holds its answers, and the
    report and its choice include it. Without the key: three models, no pi_avg folder."""
    from pofe.demo.task import make_prompt_rows, write_jsonl
    from pofe.run.evaluation.evaluate import evaluate_run
    from pofe.run.folder import RunFolder, RunState
    from pofe.run.report import write_report
    from tests.helpers import CPU_SETTINGS

    models = [build_tiny_model(tmp_path / f"m{t}", hidden_size=64, seed=t) for t in range(3)]
    folder = RunFolder(tmp_path / "run")
    folder.root.mkdir()
    write_jsonl(make_prompt_rows(3, k_wrong=1, seed=5), folder.held_out_prompts)
    state = RunState.open(folder.state, fingerprint="f", recipe="r.yml", method="sppo")
    state.base_model = state.pi_0 = str(models[0])
    for t in (1, 2):
        state.round(t).policy_out = str(models[t])
    state.save()
    pofe = {
        "generate": {"backend": "transformers", "num_candidates": 2, "max_new_tokens": 4},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
        "eta": 10.0,
        "eval": {"held_out": 3, "num_samples": 2, "train_prompts": 0, "average_iterates": True},
    }
    raw = {
        "base_model": str(models[0]),
        "plugins": ["pofe.PofePlugin"],
        "rl": "sppo",
        "datasets": [{"path": str(folder.held_out_prompts), "type": "pofe.prompts"}],
        "output_dir": str(folder.root),
        "sequence_len": 64,
        "micro_batch_size": 1,
        "num_epochs": 1,
        "learning_rate": 1e-3,
        **CPU_SETTINGS,
        "pofe": pofe,
    }
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(yaml.safe_dump(raw))
    evaluate_run(recipe, echo=lambda _: None)
    ev = json.loads((folder.eval_dir / "eval.json").read_text())
    assert [m["name"] for m in ev["models"]] == ["pi_0", "pi_1", "pi_2", "pi_avg"]
    assert ev["models"][3]["path"] == str(folder.eval_dir / "pi_avg")
    assert ev["average"] == {"index": 3, "of": ["pi_1", "pi_2"]} and ev["kl_ceiling"] is None
    assert len(ev["win_matrix"]) == 4 and len(ev["kl_to_pi_0"]) == 4 and ev["kl_to_pi_0"][3] > 0
    expected = (_state(models[1])["lm_head.weight"] + _state(models[2])["lm_head.weight"]) / 2
    torch.testing.assert_close(_state(folder.eval_dir / "pi_avg")["lm_head.weight"], expected)
    samples = [json.loads(line) for line in (folder.eval_dir / "samples.jsonl").read_text().splitlines()]
    assert sum(s["model"] == "pi_avg" for s in samples) == 3 * 2
    # the held-out best-of-k stays per round: candidates of rounds 1 and 2, none from pi_avg
    assert [b["round"] for b in ev["best_of_k"]] == [1, 2]
    report = write_report(folder)
    assert report.data["choice"]["name"] in ("pi_0", "pi_1", "pi_2", "pi_avg")
    assert "| avg | pi_avg | " in report.markdown_path.read_text()

    raw["pofe"]["eval"]["average_iterates"] = False
    recipe.write_text(yaml.safe_dump(raw))
    shutil.rmtree(folder.eval_dir)
    evaluate_run(recipe, echo=lambda _: None)
    plain = json.loads((folder.eval_dir / "eval.json").read_text())
    assert [m["name"] for m in plain["models"]] == ["pi_0", "pi_1", "pi_2"] and plain["average"] is None
    assert not (folder.eval_dir / "pi_avg").exists()
