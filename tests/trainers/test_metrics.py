"""TRL's metric names (`rewards/*`, `logps/*`) logged by the RRHF and SPPO trainers.

The trainers run for real (axolotl's trainer on the tiny model, POFE's collator); the
expected values come from scoring each candidate with a plain full log-softmax and
picking chosen and rejected by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from pofe.trainers.metrics import best_worst_metrics

# rows of prompt, responses, labels: k = 3, k = 2 (a padded slot), and one whose labels
# all tie (no pair: it counts in rrhf/* and sppo/* but not in rewards/* or logps/*)
PROMPTS = ["ab", "hello there", "xyz"]
RESPONSES = [["c", "dd", "eee"], ["fine", "ok"], ["1", "22"]]
REWARDS = [[0.5, 2.0, -1.0], [0.0, 1.0], [3.0, 3.0]]
WIN_RATES = [[0.25, 0.75, 0.5], [0.1, 0.9], [0.5, 0.5]]
ANCHORS = [[-4.0, -9.0, -12.0], [-20.0, -7.0], [-3.0, -5.0]]
ETA = 10.0
LENGTH_PENALTY = 0.5
TRL_NAMES = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def test_best_worst_metrics_by_hand():
    """Prompt 0: preference (1, 3, 2) -> chosen slot 1, rejected slot 0; rewards 0.5 vs
    -0.5, margin 1, right. Prompt 1: a tie for best between slots 0 and 1 goes to slot 0,
    rejected slot 2 (slot 3 is padding, its NaN and its preference 9 are ignored):
    rewards 1 vs 2, margin -1, wrong. Prompt 2: all preferences tie, no pair.
    Means over the 2 pairs: chosen 0.75, rejected 0.75, margin 0, accuracy 0.5,
    logps chosen (-2 + -1) / 2 = -1.5, rejected (-4 + -3) / 2 = -3.5."""
    logp = torch.tensor([[-4.0, -2.0, -9.0, 0.0], [-1.0, -8.0, -3.0, float("nan")], [-1.0, -2.0, 0.0, 0.0]])
    reward = torch.tensor([[-0.5, 0.5, 0.0, 0.0], [1.0, 7.0, 2.0, float("nan")], [1.0, 2.0, 0.0, 0.0]])
    preference = torch.tensor([[1.0, 3.0, 2.0, 0.0], [5.0, 5.0, 4.0, 9.0], [1.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, False], [True, True, False, False]])
    values, n = best_worst_metrics(logp, reward, preference, mask)
    assert n == 2
    assert values == pytest.approx(
        {
            "rewards/chosen": 0.75,
            "rewards/rejected": 0.75,
            "rewards/margins": 0.0,
            "rewards/accuracies": 0.5,
            "logps/chosen": -1.5,
            "logps/rejected": -3.5,
        }
    )


def test_no_pair_gives_nan():
    values, n = best_worst_metrics(
        torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2, dtype=bool)
    )
    assert n == 0 and all(math.isnan(v) for v in values.values())


@pytest.fixture(scope="module")
def batch_and_logps(tiny64_model, tokenizer):
    """The collated batch, and each candidate's summed log-prob and token count scored
    independently: one full sequence at a time, full log-softmax, response tokens only."""
    from transformers import AutoModelForCausalLM

    from pofe.collator import KResponseCollator
    from pofe.data.tokenize import tokenize_row

    features = []
    for prompt, responses, rewards, win_rates, anchors in zip(PROMPTS, RESPONSES, REWARDS, WIN_RATES, ANCHORS):
        row = {
            "prompt": [{"role": "user", "content": prompt}],
            "responses": [{"role": "assistant", "content": r} for r in responses],
            "rewards": rewards,
            "win_rates": win_rates,
            "anchor_logps": anchors,
        }
        feature = tokenize_row(row, tokenizer, sequence_len=128, max_prompt_len=64, truncation="drop")
        assert feature["keep"]
        features.append(feature)
    model = AutoModelForCausalLM.from_pretrained(tiny64_model, attn_implementation="eager").eval()
    logps = []
    with torch.no_grad():
        for f in features:
            row = []
            for response in f["response_ids"]:
                ids = torch.tensor([f["prompt_ids"] + response])
                token_logps = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
                row.append((token_logps[len(f["prompt_ids"]) - 1 :].sum().item(), len(response)))
            logps.append(row)
    return KResponseCollator(tokenizer)(features), logps, features


def _trainer(cls, tiny64_model, tokenizer, tmp_path, pofe):
    from dataclasses import dataclass

    from axolotl.core.training_args import AxolotlTrainingArguments
    from transformers import AutoModelForCausalLM

    from pofe.args import PofeConfig
    from pofe.collator import KResponseCollator
    from pofe.training_args import PofeTrainingArgsMixin, pofe_training_args

    model = AutoModelForCausalLM.from_pretrained(tiny64_model, attn_implementation="eager")
    # axolotl's TrainingArguments with the plugin's mixin merged in and filled from the
    # `pofe:` block, as `axolotl train` builds them (test_config follows that route)
    # (merged already when an earlier test loaded a recipe with the plugin before axolotl's
    # training_args module was first imported: merging twice is no valid class)
    args_cls = AxolotlTrainingArguments
    if not issubclass(args_cls, PofeTrainingArgsMixin):
        args_cls = dataclass(type("Args", (PofeTrainingArgsMixin, AxolotlTrainingArguments), {}))
    args = args_cls(output_dir=str(tmp_path), report_to=[], use_cpu=True, **pofe_training_args(PofeConfig(**pofe)))
    return cls(model=model, args=args, data_collator=KResponseCollator(tokenizer))


def _expected(logps, implicit_reward, labels):
    """Means over prompts with a pair of chosen = argmax label, rejected = argmin label."""
    sums, n = dict.fromkeys(TRL_NAMES, 0.0), 0
    for row, label in zip(logps, labels):
        if max(label) == min(label):
            continue
        n += 1
        c, r = label.index(max(label)), label.index(min(label))
        rc, rr = implicit_reward(row, c), implicit_reward(row, r)
        for name, value in zip(TRL_NAMES, (rc, rr, rc - rr, float(rc > rr), row[c][0], row[r][0])):
            sums[name] += value
    return {name: total / n for name, total in sums.items()}


def _stored(trainer, inputs, split):
    """What one compute_loss call stores, as axolotl will log it (one value each)."""
    trainer.model.train(split == "train")
    trainer.compute_loss(trainer.model, inputs)
    stored = trainer._stored_metrics[split]
    return {k: v["values"][-1] for k, v in stored.items()}


@pytest.mark.trl
@pytest.mark.parametrize("split", ["train", "eval"])
def test_rrhf_trainer_logs_trl_names(batch_and_logps, tiny64_model, tokenizer, tmp_path, split, one_torch_thread):
    """rewards/* are RRHF's scores logp / n ** 0.5 for the best- and worst-reward candidate
    (prompt 0: slots 1 and 2, prompt 1: slots 1 and 0; prompt 2 ties: left out)."""
    from pofe.trainers import RRHFTrainer

    batch, logps, _ = batch_and_logps
    trainer = _trainer(
        RRHFTrainer, tiny64_model, tokenizer, tmp_path, {"method": "rrhf", "length_penalty": LENGTH_PENALTY}
    )
    stored = _stored(trainer, dict(batch), split)
    expected = _expected(logps, lambda row, i: row[i][0] / row[i][1] ** LENGTH_PENALTY, REWARDS)
    prefix = "" if split == "train" else "eval_"
    for name, value in expected.items():
        assert stored[prefix + name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert f"{prefix}rrhf/rank" in stored  # POFE's own names stay beside TRL's


@pytest.mark.trl
@pytest.mark.parametrize("split", ["train", "eval"])
def test_sppo_trainer_logs_trl_names(batch_and_logps, tiny64_model, tokenizer, tmp_path, split, one_torch_thread):
    """rewards/* are beta * (logp - anchor), beta = 1/eta, for the highest- and lowest-
    win-rate candidate (prompt 0: slots 1 and 0, prompt 1: slots 1 and 0)."""
    from pofe.trainers import SPPOTrainer

    batch, logps, _ = batch_and_logps
    trainer = _trainer(SPPOTrainer, tiny64_model, tokenizer, tmp_path, {"method": "sppo", "eta": ETA})
    stored = _stored(trainer, dict(batch), split)
    anchors = iter(ANCHORS)
    rows = [[(lp - a, n) for (lp, n), a in zip(row, next(anchors))] for row in logps]
    expected = _expected(rows, lambda row, i: row[i][0] / ETA, WIN_RATES)
    # logps/* are the policy's own summed log-probs, not the log-ratios
    expected["logps/chosen"] = (logps[0][1][0] + logps[1][1][0]) / 2
    expected["logps/rejected"] = (logps[0][0][0] + logps[1][0][0]) / 2
    prefix = "" if split == "train" else "eval_"
    for name, value in expected.items():
        assert stored[prefix + name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert f"{prefix}sppo/loss" in stored


def test_sppo_hard_takes_column_0_as_chosen(batch_and_logps, tiny64_model, tokenizer, tmp_path, one_torch_thread):
    """With sppo_loss: hard the loss reads column 0 as chosen, so do the metrics, even where
    the win rates (0.1, 0.9) would say otherwise; rewards/chosen = sppo/chosen_logratio / eta,
    TRL's sppo_hard rewards. Prompts 1 and 2 (both k = 2): both are pairs."""
    from pofe.collator import KResponseCollator
    from pofe.trainers import SPPOTrainer

    _, logps, features = batch_and_logps
    trainer = _trainer(
        SPPOTrainer, tiny64_model, tokenizer, tmp_path, {"method": "sppo", "eta": ETA, "sppo_loss": "hard"}
    )
    stored = _stored(trainer, KResponseCollator(tokenizer)(features[1:]), "train")
    ratios = [[lp - a for (lp, _), a in zip(logps[b], ANCHORS[b])] for b in (1, 2)]
    assert stored["rewards/chosen"] == pytest.approx((ratios[0][0] + ratios[1][0]) / 2 / ETA, rel=1e-4)
    assert stored["rewards/rejected"] == pytest.approx((ratios[0][1] + ratios[1][1]) / 2 / ETA, rel=1e-4)
    assert stored["logps/chosen"] == pytest.approx((logps[1][0][0] + logps[2][0][0]) / 2, rel=1e-4)
    assert stored["rewards/chosen"] == pytest.approx(stored["sppo/chosen_logratio"] / ETA, rel=1e-4)
    assert stored["rewards/accuracies"] == stored["sppo/accuracy"]


@pytest.mark.parametrize("broken", ["anchor", "logp"])
def test_non_finite_logps_or_anchors_stop_training_naming_the_rows(
    batch_and_logps, tiny64_model, tokenizer, tmp_path, broken, one_torch_thread
):
    """Bad case 5 of issue 20: a NaN anchor (here in the data's anchor_logps, as a NaN table
    row would give) or a NaN policy log-prob trained on with loss 0 and grad_norm nan and
    exited 0. Now the step stops, naming the batch's row_ids and what to do. A NaN in a
    padded slot (prompt 1 has k = 2 of 3) is not read and passes."""
    from pofe.trainers import SPPOTrainer

    batch = dict(batch_and_logps[0])
    batch["row_id"] = torch.tensor([10, 11, 12])
    trainer = _trainer(SPPOTrainer, tiny64_model, tokenizer, tmp_path, {"method": "sppo", "eta": ETA})
    batch["anchor_logps"] = batch["anchor_logps"].clone()
    batch["anchor_logps"][1, 2] = float("nan")  # padding
    trainer.compute_loss(trainer.model, batch)
    if broken == "anchor":
        batch["anchor_logps"][2, 0] = float("nan")
        needle = r"anchor is not finite for rows \(row_id\) \[12\]: fix field anchor_logps"
    else:
        with torch.no_grad():
            trainer.model.lm_head.weight[:, 0] = float("nan")  # every logit NaN: every row
        needle = r"logp is not finite for rows \(row_id\) \[10, 11, 12\]: .*bf16"
    with pytest.raises(FloatingPointError, match=needle):
        trainer.compute_loss(trainer.model, batch)


# ---- two processes (gloo): TRL's metrics are means over every rank's pairs -------------


def _pair_batch():
    """(5, 3) candidates; prompts 1 and 3 tie throughout (no pair): rank 0 (prompts 0-1) has
    1 pair, rank 1 (prompts 2-4) has 2, so a mean of the ranks' means would be wrong."""
    g = torch.Generator().manual_seed(5)
    logp = -torch.rand(5, 3, generator=g) * 10
    reward = torch.randn(5, 3, generator=g)
    preference = torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 1.0], [3.0, 1.0, 2.0], [0.5, 0.5, 0.5], [1.0, 0.0, 2.0]])
    return logp, reward, preference, torch.ones(5, 3, dtype=torch.bool)


def _rank_worker(rank, store, out):
    from datetime import timedelta
    from types import SimpleNamespace

    import torch.distributed as dist

    from pofe.trainers.base import KResponseTrainer

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=600)
    )
    try:
        rows = slice(0, 2) if rank == 0 else slice(2, 5)
        pairs = best_worst_metrics(*(t[rows] for t in _pair_batch()))
        stored = {}
        trainer = SimpleNamespace(
            args=SimpleNamespace(device=torch.device("cpu")),
            store_metrics=lambda metrics, split: stored.update(metrics),
        )
        KResponseTrainer.log_stats(
            trainer,
            SimpleNamespace(training=False),
            "rrhf",
            {"rank": float(rank)},
            rows.stop - rows.start,
            pairs=pairs,
        )
        torch.save(stored, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_pair_metrics_are_means_over_every_ranks_pairs(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    expected, n = best_worst_metrics(*_pair_batch())  # one process, all 5 prompts: 3 pairs
    assert n == 3
    for rank in range(2):
        stored = torch.load(tmp_path / f"rank{rank}.pt")
        assert stored["eval_rrhf/rank"] == pytest.approx(3 / 5)  # 0 x 2 prompts + 1 x 3 prompts
        for name, value in expected.items():
            assert stored[f"eval_{name}"] == pytest.approx(value, rel=1e-6), name


def test_a_mean_of_zero_is_logged_as_0_not_minus_0():
    """SPPO's mean target is 0 by construction with every candidate kept; when its float comes
    out as -0.0 the log showed 'sppo/target': '-0' (transformers formats with .4g). Stored: +0.0."""
    import math
    from types import SimpleNamespace

    from pofe.trainers.base import KResponseTrainer

    stored = {}
    trainer = SimpleNamespace(
        args=SimpleNamespace(device=torch.device("cpu")), store_metrics=lambda metrics, split: stored.update(metrics)
    )
    KResponseTrainer.log_stats(trainer, SimpleNamespace(training=True), "sppo", {"target": -0.0, "loss": 2.0}, 4)
    assert stored == {"sppo/loss": 2.0, "sppo/target": 0.0}
    assert math.copysign(1.0, stored["sppo/target"]) == 1.0 and f"{stored['sppo/target']:.4g}" == "0"
