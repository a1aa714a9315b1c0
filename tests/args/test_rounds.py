"""The iterated-run keys of the `pofe:` block (`pofe.args.rounds`): rounds, eval, their rules."""

from __future__ import annotations

import pytest

from pofe.args import PofeConfig
from pofe.args.rounds import EvalConfig


def test_config_keys():
    cfg = PofeConfig(method="sppo", rounds=3, eval={"held_out": 5})
    assert cfg.round_prompts == "auto" and cfg.eval.num_samples == 4 and cfg.eval.temperature == 1.0
    assert PofeConfig().rounds == 1 and PofeConfig().eval == EvalConfig()  # on, with the default slice
    assert EvalConfig().held_out is None and EvalConfig().has_held_out and EvalConfig(num_samples=2).num_samples == 2
    with pytest.raises(ValueError, match="held-out prompts"):
        EvalConfig(held_out=0, num_samples=2)
    with pytest.raises(ValueError, match="not both"):
        EvalConfig(prompts="p.jsonl", held_out=3)
    with pytest.raises(ValueError, match="greedy"):
        EvalConfig(held_out=3, temperature=0.0, num_samples=2)
    with pytest.raises(ValueError, match="OpenAI-compatible server"):
        PofeConfig(
            method="rrhf",
            rounds=2,
            generate={"backend": "openai", "base_url": "http://x/v1"},
            judge={"type": "python", "function": "m:f"},
        )
