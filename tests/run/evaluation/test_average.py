"""pi_avg (`pofe.run.evaluation.average`): the iterates' weights averaged, tensor by tensor,
checked against transformers' own state dicts averaged in float64."""

from __future__ import annotations

import json

import pytest
import torch
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
