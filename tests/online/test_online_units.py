"""`pofe.online` without training: the block's rules, the KL-penalised reward, a refresh's rows,
stats and files."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from pofe.args import PofeArgs, PofeConfig
from pofe.columns import PI_0_LOGPS
from pofe.files import UnreadableFile
from pofe.losses import kl_penalised_rewards
from pofe.methods import method_spec
from pofe.online.prompts import PromptCollator, steps_per_epoch
from pofe.online.refresh import (
    LOGP,
    TOKENS,
    Refreshed,
    Window,
    read_refresh,
    with_scores,
    write_refresh,
)
from pofe.online.stats import dropped_candidates, window_stats
from pofe.records.refresh import refresh_dir
from tests.helpers import pofe_block


def _online(method: str, **online) -> dict:
    return {"method": method, **pofe_block(method), "online": online}


def test_the_block_reads_refresh_every_and_kl_coef():
    pofe = PofeConfig.model_validate(_online("rrhf", refresh_every=32, kl_coef=0.01))
    assert (pofe.online.refresh_every, pofe.online.kl_coef) == (32, 0.01)
    assert PofeConfig.model_validate(_online("rrhf")).online.model_dump() == {
        "refresh_every": 32,
        "kl_coef": 0.0,
        "monitor_every": 10,  # a few lines every 10th refresh: every one flooded the console
        "monitor_samples": 2,
    }


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (
            {"refresh_every": 0},
            "refresh_every\n  Value error, refresh_every: 0 is out of range; set a whole number >= 1",
        ),
        ({"refresh_evry": 4}, "refresh_evry"),
        ({"kl_coef": -0.1}, "kl_coef\n  Value error, kl_coef: -0.1 is out of range; set a finite number >= 0.0"),
    ],
)
def test_bad_values_are_refused_by_name(block, message):
    with pytest.raises(ValidationError, match=message):
        PofeConfig.model_validate(_online("rrhf", **block))


def test_what_online_training_does_not_combine_with_is_refused():
    with pytest.raises(ValidationError, match="trains on win rates and anchors each refresh to the policy"):
        PofeConfig.model_validate(_online("sppo", kl_coef=0.01))
    with pytest.raises(ValidationError, match="replaces pofe.rounds: set rounds: 1"):
        PofeConfig.model_validate({**_online("rrhf"), "rounds": 2})
    without = {"method": "rrhf", "online": {}}
    with pytest.raises(ValidationError, match="it needs a pofe.prompts dataset with pofe.generate and pofe.judge"):
        PofeConfig.model_validate(without)


def test_anchor_mix_online_scores_pi_0_as_kl_coef_does_and_pi_0_is_the_base_model():
    """pi_0 is scored at each refresh for RRHF's kl_coef and for SPPO's anchor_mix, and only then;
    online, pi_0 is base_model (another model named by pi_0 is refused)."""
    mixed = PofeConfig.model_validate({**_online("sppo"), "anchor_mix": 0.25})
    assert mixed.anchor_mix == 0.25 and mixed.online_scores_pi_0
    assert PofeConfig.model_validate(_online("rrhf", kl_coef=0.01)).online_scores_pi_0
    assert not PofeConfig.model_validate(_online("sppo")).online_scores_pi_0
    assert not PofeConfig.model_validate(_online("rrhf")).online_scores_pi_0
    assert not PofeConfig.model_validate(
        {"method": "sppo", **pofe_block("sppo"), "anchor_mix": 0.25}
    ).online_scores_pi_0
    with pytest.raises(ValidationError, match=r"pofe.pi_0 \(/m/sft\): online, pi_0 for pofe.anchor_mix is"):
        PofeConfig.model_validate({**_online("sppo"), "anchor_mix": 0.25, "pi_0": "/m/sft"})


def test_an_online_recipe_trains_on_prompts_and_evaluates_apart():
    base = {"rl": "rrhf", "pofe": _online("rrhf"), "datasets": [{"path": "p.jsonl", "type": "pofe.prompts"}]}
    PofeArgs.model_validate(base)
    fixed = {**base, "datasets": [*base["datasets"], {"path": "r.jsonl", "type": "pofe.rrhf"}]}
    with pytest.raises(ValidationError, match=r"datasets\[1\] \(r.jsonl\): pofe.online samples every candidate"):
        PofeArgs.model_validate(fixed)
    with pytest.raises(ValidationError, match="hold prompts out with pofe.eval.held_out"):
        PofeArgs.model_validate({**base, "val_set_size": 0.1})


def test_kl_penalised_rewards_by_hand():
    import torch

    shaped = kl_penalised_rewards(
        torch.tensor([[1.0, 0.5]]), torch.tensor([[-3.0, -5.0]]), torch.tensor([[-4.0, -4.0]]), kl_coef=0.01
    )
    # 1 - 0.01 * (-3 + 4) and 0.5 - 0.01 * (-5 + 4)
    assert shaped[0].tolist() == pytest.approx([0.99, 0.51], abs=1e-7)


def _row(**extra) -> dict:
    return {
        "prompt_index": 7,
        "prompt": "1+2=",
        "responses": ["3", "4"],
        TOKENS: {"prompt_ids": [1, 2], "response_ids": [[3, 9], [4, 9]]},
        **extra,
    }


def test_with_scores_folds_the_anchor_or_the_penalty_in():
    sppo = with_scores(_row(win_rates=[0.75, 0.25], **{LOGP: [-2.0, -6.0]}), method_spec("sppo"), kl_coef=0.0)
    assert sppo == {
        "prompt_ids": [1, 2],
        "response_ids": [[3, 9], [4, 9]],
        "win_rates": [0.75, 0.25],
        "anchor_logps": [-2.0, -6.0],
    }
    rrhf = _row(rewards=[1.0, 0.0], **{LOGP: [-2.0, -6.0], PI_0_LOGPS: [-3.0, -5.0]})
    shaped = with_scores(rrhf, method_spec("rrhf"), kl_coef=0.1)
    assert shaped["rewards"] == pytest.approx([1.0 - 0.1 * 1.0, 0.0 - 0.1 * -1.0])
    assert "anchor_logps" not in shaped
    assert with_scores(rrhf, method_spec("rrhf"), kl_coef=0.0)["rewards"] == [1.0, 0.0]


def test_with_scores_gives_sppo_pi_0_beside_its_anchor_under_anchor_mix(tokenizer):
    """The trainer mixes the two (`SPPOTrainer`, `pofe.losses.mixed_anchor`) as offline, where pi_0's
    come from a table: here from the rows (`AnchorLogps.lookup_pi_0`)."""
    from pofe.anchor.logps import AnchorLogps

    row = _row(win_rates=[0.75, 0.25], **{LOGP: [-2.0, -6.0], PI_0_LOGPS: [-9.0, -7.0]})
    mixed = with_scores(row, method_spec("sppo"), kl_coef=0.0, anchor_mix=0.5)
    assert (mixed["anchor_logps"], mixed[PI_0_LOGPS]) == ([-2.0, -6.0], [-9.0, -7.0])
    assert PI_0_LOGPS not in with_scores(row, method_spec("sppo"), kl_coef=0.0)
    batch = PromptCollator(tokenizer).rows([mixed])
    assert batch[PI_0_LOGPS].tolist() == [[-9.0, -7.0]]
    assert AnchorLogps(trainer=None).lookup_pi_0(None, batch) is batch[PI_0_LOGPS]


def test_window_stats_count_prompts_and_read_the_policys_samples_only():
    """Two prompts: the first kept 3 candidates after dedupe dropped 1 exact and 1 near copy and
    the judge abstained on 1 of 4; the second kept 1 after 2 empty samples and 1 cut at
    max_new_tokens, and 1 sample kept cut where it began a user turn. Counts as generate_shard and
    judge_shard record them."""
    generated = [
        {"candidates": ["3", "5", "4", "2"], "sources": ["answer", "policy", "policy", "policy"], "exact_dups": 1},
        {"candidates": ["x"], "sources": ["policy"], "empty": 2, "truncated_dropped": 1, "user_turn_cut": 1},
    ]
    generated[0]["near_dups"] = 1
    judged = [
        {"responses": ["3", "5", "4"], "rewards": [1.0, 0.2, 0.6], "judged": 4, "abstained": 1},
        {"responses": ["x"], "rewards": [0.0], "judged": 1, "abstained": 0},
    ]
    stats = window_stats(generated, judged, kept={0: {}}, kl=[0.5, 1.5, -1.0])
    assert stats == {
        "prompts": 2.0,
        "prompts_dropped": 1.0,  # one candidate left: too few to rank
        "candidates": 4.0,
        "candidates_empty": 2.0,
        "candidates_duplicate": 2.0,
        "candidates_truncated": 1.0,
        "candidates_cut_at_user_turn": 1.0,
        "judge_verdicts": 5.0,
        "judge_abstentions": 1.0,
        "candidate_reward_mean": pytest.approx((0.2 + 0.6 + 0.0) / 3),  # the dataset's answer left out
        "candidate_reward_best": pytest.approx((0.6 + 0.0) / 2),
        "kl_to_pi_0": pytest.approx(1.0 / 3),
    }


def test_a_window_whose_samples_were_all_empty_says_so(tmp_path):
    """A policy that samples only its end-of-turn token: 20 prompts x 4 samples, all empty, no
    dataset responses. The error of a micro-batch left with nothing says that every candidate
    removed was empty, and what to do about a policy that ends at once (it listed dedupe,
    abstentions and the length policy, never the empty samples)."""
    generated = [{"candidates": [], "sources": [], "empty": 4} for _ in range(20)]
    judged = [{"responses": [], "rewards": None, "abstained": 0} for _ in range(20)]
    stats = window_stats(generated, judged, kept={}, kl=[])
    assert dropped_candidates(stats, tmp_path) == (
        "Of this window's 20 prompts, 20 kept too few: its candidates removed were 80 empty (the policy ended its "
        "turn at once), 0 duplicates (generate.dedupe), 0 cut at max_new_tokens (candidates.truncated: drop), and "
        f"the judge abstained on 0 of 0 verdicts; the length policy drops the rest (the samples are in "
        f"{tmp_path / 'generate.jsonl'}). The policy mostly answers with its end-of-turn token alone: check its "
        "samples and its chat template's generation prompt, raise pofe.generate.temperature, or add dataset "
        "responses (generate.include_dataset_responses)"
    )


def test_a_refresh_reads_back_as_written_and_only_once_finished(tmp_path):
    folder = refresh_dir(tmp_path, 12)
    assert folder == tmp_path / "online" / "refresh-0000012"
    assert refresh_dir(tmp_path, 12, rank=1, world=2) == folder / "rank-1"
    window = Window(12, [[3, 1], [0, 2]])
    rows = [_row(rewards=[1.0, float("0.5")])]
    write_refresh(
        folder,
        Refreshed(window, [], {"prompts": 4.0}),
        [{"index": 7}],
        [{"index": 7}],
        rows,
        made={"method": "rrhf"},
        refresh_every=2,
    )
    assert read_refresh(folder) == (window, rows, {"prompts": 4.0})
    written = json.loads((folder / "refresh.json").read_text())
    assert written["micro_batches"] == [[3, 1], [0, 2]] and written["format"] == 2
    # an older POFE's (no format; its stats named KL to pi_0 otherwise): refused, naming the folder
    (folder / "refresh.json").write_text(json.dumps({k: v for k, v in written.items() if k != "format"}))
    with pytest.raises(UnreadableFile, match=rf"format 1, unrecorded.*Delete {folder}: a resumed run samples"):
        read_refresh(folder)
    (folder / "refresh.json").unlink()  # killed before the refresh was finished: sampled again
    assert read_refresh(folder) is None


@pytest.mark.parametrize(
    ("prompts", "micro", "accumulation", "world", "steps"), [(60, 20, 1, 1, 3), (60, 7, 1, 1, 9), (60, 5, 2, 2, 3)]
)
def test_steps_per_epoch_as_transformers_counts_them(prompts, micro, accumulation, world, steps):
    from axolotl.utils.dict import DictDefault

    cfg = DictDefault(micro_batch_size=micro, gradient_accumulation_steps=accumulation, world_size=world)
    assert steps_per_epoch(cfg, prompts) == steps


def test_held_out_prompts_and_their_repeats_are_not_trained_on(tmp_path):
    """`pofe.eval.held_out: 1` keeps the last row for `axolotl pofe eval`, and, as offline, every
    other row with its prompt; the prompts left are indexed in order."""
    import json

    from axolotl.utils.dict import DictDefault

    from pofe.args import pofe_config
    from pofe.online.prompts import PROMPT_INDEX, PROMPT_ROW, load_online_prompts

    path = tmp_path / "prompts.jsonl"
    rows = ["1+1=", "2+2=", "3+3=", "5+5=", "2+2="]  # the last held out, and row 1 with it
    path.write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in rows))
    raw = {
        "rl": "rrhf",
        "datasets": [{"path": str(path), "type": "pofe.prompts"}],
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "num_epochs": 1,
        "pofe": {**_online("rrhf"), "eval": {"held_out": 1}},
    }
    cfg = DictDefault(raw)
    cfg.datasets = [DictDefault(d) for d in raw["datasets"]]
    meta = load_online_prompts(cfg, pofe_config(raw))
    rows = meta.train_dataset
    assert rows[PROMPT_INDEX] == [0, 1, 2]
    assert [json.loads(r)["prompt"] for r in rows[PROMPT_ROW]] == ["1+1=", "3+3=", "5+5="]
    assert meta.total_num_steps == 2


def test_a_prompt_field_of_another_name_reaches_a_refresh_as_its_prompt(tmp_path):
    """`field_prompt: question`: a refresh reads each row's prompt under "prompt" (the column its
    generate stage renders) and the row's other columns as they are, for the judge."""
    import json

    from axolotl.utils.dict import DictDefault

    from pofe.args import pofe_config
    from pofe.online.prompts import PROMPT_ROW, load_online_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"question": p, "answer": a}) + "\n" for p, a in [("1+1=", 2), ("2+3=", 5)]))
    raw = {
        "rl": "rrhf",
        "datasets": [{"path": str(path), "type": "pofe.prompts", "field_prompt": "question"}],
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "num_epochs": 1,
        "pofe": _online("rrhf"),
    }
    cfg = DictDefault(raw)
    cfg.datasets = [DictDefault(d) for d in raw["datasets"]]
    rows = [json.loads(r) for r in load_online_prompts(cfg, pofe_config(raw)).train_dataset[PROMPT_ROW]]
    assert rows == [{"prompt": "1+1=", "answer": 2}, {"prompt": "2+3=", "answer": 5}]


def test_what_made_a_refresh_is_recorded_and_compared_setting_by_setting(tmp_path):
    """made_with records the method, the judge with its code's digest, the generate settings (dedupe
    resolved per method, as the refresh samples), the
    filters, kl_coef, the tokenisation and, when the refresh scores under pi_0 (kl_coef), pi_0's
    weights (base_model's folder, by its files); a change is said per setting, a judge's digest only
    when its code changed under the same name, pi_0's as base_model's weights."""
    from pofe.files import weights_fingerprint
    from pofe.online.made_with import made_with, setting_changes
    from pofe_candidates.identity import module_digest

    base = tmp_path / "pi_0"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"old weights")
    pofe = PofeConfig.model_validate(_online("rrhf", refresh_every=4, kl_coef=0.01))
    made = made_with(pofe, sequence_len=64, base_model=str(base))
    assert made["judge_identity"] == {"pofe.demo.task:reward": module_digest("pofe.demo.task")}
    assert (made["method"], made["kl_coef"], made["generate"]["temperature"]) == ("rrhf", 0.01, 1.0)
    assert made["pi_0_weights"] == weights_fingerprint(base)
    # without kl_coef no row holds pi_0's log-probs: its weights make no refresh
    assert "pi_0_weights" not in made_with(PofeConfig.model_validate(_online("rrhf")), 64, base_model=str(base))
    # dedupe as `axolotl preprocess` resolves it: the method's default (RRHF drops copies, SPPO keeps all K)
    assert made["generate"]["dedupe"] is True
    assert (
        made_with(PofeConfig.model_validate(_online("sppo")), 64, base_model=str(base))["generate"]["dedupe"] is False
    )
    assert made["tokenize"] == {"sequence_len": 64, "max_prompt_len": 32, "truncation": pofe.truncation}
    again = PofeConfig.model_validate(_online("rrhf", refresh_every=8, kl_coef=0.01))
    assert made_with(again, 64, base_model=str(base)) == made
    hotter = made_with(
        PofeConfig.model_validate(
            {**_online("rrhf", kl_coef=0.01), "generate": {**pofe_block("rrhf")["generate"], "temperature": 0.7}}
        ),
        64,
        base_model=str(base),
    )
    assert setting_changes(made, hotter) == "generate.temperature: 1.0 then, 0.7 now"
    edited = {**made, "judge_identity": {"pofe.demo.task:reward": "f" * 64}}
    digest = made["judge_identity"]["pofe.demo.task:reward"][:12]
    assert setting_changes(made, edited) == (
        f"the code or weights of pofe.demo.task:reward (sha256 {digest} then, ffffffffffff now)"
    )
    # base_model's weights rewritten in place: the same folder, another pi_0
    (base / "model.safetensors").write_bytes(b"new weights")
    retrained = made_with(pofe, 64, base_model=str(base))
    assert setting_changes(made, retrained) == (
        f"the weights of base_model (pi_0, whose log-probs its rows hold): {made['pi_0_weights'][:12]} then, "
        f"{weights_fingerprint(base)[:12]} now"
    )
    # rows written before pi_0's log-probs were named `pi_0_logps` (as `logp_base`) are not read as if they held them
    older = {k: v for k, v in made.items() if k != "rows_format"}
    assert made["rows_format"] == 2 and setting_changes(older, made) == (
        "rows_format: unset then, 2 now (an older POFE wrote its rows.jsonl, in a form not read any more)"
    )


def test_a_refresh_whose_pairs_all_tied_is_warned_and_one_with_some_not():
    """The warning's counts are the merged stats'; a refresh with one untied pair, or none played
    (RRHF, SPPO), is not warned; a pairwise judge is told to check that it tells responses apart."""
    from pathlib import Path

    from pofe.online.summary import all_pairs_tied
    from pofe_candidates.config import JudgeConfig

    pairwise = JudgeConfig(type="python_pairwise", function="m:judge")
    means = {"prompts": 4.0, "pairs": 16.0, "pairs_tied": 16.0}
    assert all_pairs_tied(2, 5, means, pairwise, Path("out/online/refresh-0000005")) == (
        "POFE: online refresh 2 at step 5: the judge tied all 16 pairs of 4 prompts (every preference 1/2), so the "
        "steps until the next refresh learn nothing from it: only the KL to pi_0 (pofe.online.kl_coef) moves the "
        "policy. The pairs are in out/online/refresh-0000005/judge.jsonl. The judge (m:judge) gave every pair 1/2: "
        "check that it tells two different responses apart."
    )
    for untied in ({**means, "pairs_tied": 15.0}, {"prompts": 4.0, "pairs": 0.0, "pairs_tied": 0.0}, {"prompts": 4.0}):
        assert all_pairs_tied(2, 5, untied, pairwise, Path("out")) is None


def test_a_refresh_summary_says_what_its_stats_hold():
    """The console line of a Nash-MD refresh with abstentions, and of an RRHF one without (no
    preference, no abstention clause), of one that dropped prompts, and of a monitored one: each
    figure as merged, to three decimals."""
    from pofe.online.summary import refresh_summary

    nash = {
        "prompts": 4.0,
        "candidates": 16.0,
        "candidate_reward_mean": 0.125,
        "candidate_reward_best": 0.5,
        "kl_to_pi_0": 0.0104,
        "preference": 0.5625,
        "mixture_kl": 0.02,
        "judge_verdicts": 32.0,
        "judge_abstentions": 2.0,
        "generate_seconds": 1.25,
        "judge_seconds": 0.5,
    }
    assert refresh_summary(3, 6, nash) == (
        "POFE: online refresh 3 at step 6: 4 prompts, 16 candidates, candidate reward 0.125 (best-of-k 0.500), "
        "KL to pi_0 0.010, preference over the mixture 0.562 (mixture's KL from the policy 0.020 per token), "
        "judge abstained on 2 of 32 verdicts; generated in 1.2 s, judged in 0.5 s"
    )
    assert refresh_summary(1, 0, {"prompts": 2.0, "candidates": 8.0, "judge_abstentions": 0.0}) == (
        "POFE: online refresh 1 at step 0: 2 prompts, 8 candidates; generated in 0.0 s, judged in 0.0 s"
    )
    tied = {**nash, "pairs": 16.0, "pairs_tied": 3.0}
    assert refresh_summary(3, 6, tied) == refresh_summary(3, 6, nash).replace(
        "per token), ", "per token), 3 of 16 pairs tied, "
    )
    cut = {**nash, "candidates_cut_at_user_turn": 7.0}
    assert refresh_summary(3, 6, cut) == refresh_summary(3, 6, nash).replace(
        "per token), ", "per token), 7 samples cut where they began a user turn, "
    )
    assert refresh_summary(3, 6, {**cut, "opponents_cut_at_user_turn": 2.0}) == refresh_summary(3, 6, nash).replace(
        "per token), ", "per token), 7 samples and 2 opponents cut where they began a user turn, "
    )
    dropped = {"prompts": 4.0, "candidates": 9.0, "prompts_dropped": 2.0}
    assert refresh_summary(5, 12, dropped) == (
        "POFE: online refresh 5 at step 12: 4 prompts, 9 candidates, 2 prompts dropped (too few candidates kept: "
        "not trained on); generated in 0.0 s, judged in 0.0 s"
    )
    monitored = {"prompts": 2.0, "candidates": 8.0, "reference_perplexity": 63.78, "judge2_reward_mean": 0.25}
    assert refresh_summary(11, 40, monitored) == (
        "POFE: online refresh 11 at step 40: 2 prompts, 8 candidates, judge2 reward 0.250, "
        "reference perplexity 63.780; generated in 0.0 s, judged in 0.0 s"
    )


def test_the_console_shows_about_one_refresh_line_per_logged_step():
    """Lines shown, worked by hand. The Nash-MD recipe (logging_steps 10, a refresh every step,
    monitor_every 10): one refresh in ceil(10 / 1) = 10, refreshes 1, 11, ..., 291 (the monitor's
    too), and 300, the last. The online RRHF/SPPO recipes (refresh_every 3): one in ceil(10 / 3) = 4,
    1, 5, 9, ... beside the monitor's 11, 31, ... (21 is 4 x 5 + 1). A refresh every 32 steps shows
    each; a warned refresh is always shown; the note names the cadence and where the rest are."""
    from pathlib import Path

    from pofe.online.summary import ConsoleCadence

    def shown(cadence, refreshes, warned=()):
        return [
            n
            for n in range(1, refreshes + 1)
            if cadence.shows(n, monitored=(n - 1) % 10 == 0, last=n == refreshes, warned=n in warned)
        ]

    nash_md = ConsoleCadence(logging_steps=10, refresh_every=1, monitor_every=10)
    assert shown(nash_md, 300) == [*range(1, 292, 10), 300]
    assert shown(nash_md, 300, warned={7, 8}) == [1, 7, 8, *range(11, 292, 10), 300]
    assert nash_md.note(Path("out/online")) == (
        " [the console shows one refresh in 10 (logging_steps 10 / refresh_every 1), the last and any with a "
        "warning; every refresh is in the training log (online/*) and in out/online/refresh-*/refresh.json]"
    )
    sppo = ConsoleCadence(logging_steps=10, refresh_every=3, monitor_every=10)
    assert shown(sppo, 25) == [1, 5, 9, 11, 13, 17, 21, 25]
    assert sppo.note(Path("o")) == (
        " [the console shows one refresh in 4 (logging_steps 10 / refresh_every 3), each monitored one "
        "(monitor_every 10), the last and any with a warning; every refresh is in the training log (online/*) "
        "and in o/refresh-*/refresh.json]"
    )
    rrhf = ConsoleCadence(logging_steps=10, refresh_every=32, monitor_every=1)
    assert shown(rrhf, 3) == [1, 2, 3] and rrhf.note(Path("o")) == ""
