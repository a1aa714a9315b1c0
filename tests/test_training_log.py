"""The lines `axolotl train` of a POFE recipe ends with (`pofe.training_log`), from hand-built
log histories; the whole console's are `tests/test_e2e_train.py`'s."""

from __future__ import annotations

from axolotl.utils.dict import DictDefault

from pofe.args import pofe_config
from pofe.training_log import LOCK_FD_ENV, training_summary
from tests.helpers import pofe_block

# steps 10 and 20 logged; the refresh's online/* entry has no loss, and the last entry is the
# Trainer's run summary (train_loss, no step)
HISTORY = [
    {"step": 10, "loss": 0.75, "nash_md/preference": 0.5},
    {"step": 10, "online/candidate_reward_mean": 0.125},
    {"step": 20, "loss": 0.5, "nash_md/preference": 0.625},
    {"step": 20, "online/candidate_reward_mean": 0.25},
    {"train_loss": 0.625},
]


def _cfg(**top) -> DictDefault:
    return DictDefault({"output_dir": "out", "axolotl_config_path": "r.yml", "logging_steps": 10, **top})


def test_an_online_lora_training_says_its_curves_and_the_next_command(monkeypatch):
    monkeypatch.delenv(LOCK_FD_ENV, raising=False)
    block = pofe_block("nash_md")
    block["generate"].pop("include_dataset_responses")  # Nash-MD trains on its own samples only
    pofe = pofe_config({"rl": "nash_md", "pofe": {**block, "online": {}, "eval": {"held_out": 8}}})
    assert training_summary(_cfg(adapter="lora"), pofe, HISTORY, 20) == [
        "POFE: trained rl: nash_md (a LORA adapter, online) into out, 20 steps: loss 0.750 -> 0.500, "
        "nash_md/preference 0.500 -> 0.625, online/candidate_reward_mean 0.125 -> 0.250",
        "POFE: next, evaluate it against its base on held-out prompts: axolotl pofe eval r.yml",
    ]


def test_a_round_of_a_run_or_a_recipe_without_evaluation_says_what_it_trained_only(monkeypatch):
    """Shorter than logging_steps: nothing logged. `axolotl pofe run`'s stage (its lock's descriptor
    in the environment) and `pofe.eval: false` get no next command, nor the held-out advice."""
    pofe = pofe_config({"rl": "rrhf", "pofe": pofe_block("rrhf")})
    trained = "POFE: trained rl: rrhf (full fine-tune) into out, 3 steps: nothing logged (fewer steps than logging_steps, 10)"
    monkeypatch.setenv(LOCK_FD_ENV, "5")
    assert training_summary(_cfg(), pofe, [{"train_loss": 1.0}], 3) == [trained]
    monkeypatch.delenv(LOCK_FD_ENV)
    off = pofe_config({"rl": "rrhf", "pofe": {**pofe_block("rrhf"), "eval": False}})
    assert training_summary(_cfg(), off, [], 3) == [trained]
    assert training_summary(_cfg(val_set_size=0.1), pofe, [], 3)[1:] == [
        "POFE: next, evaluate it against its base on held-out prompts: axolotl pofe eval r.yml"
    ]
