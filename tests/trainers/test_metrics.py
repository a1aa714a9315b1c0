"""The pair metrics the RRHF and SPPO trainers log: TRL's names (`rewards/*`, `logps/*`) where
the quantity is TRL's, RRHF's own (`rrhf/worst_score`, ...) where it is not; and the window that
keeps them on the device until transformers logs.

The trainers run for real (axolotl's trainer on the tiny model, POFE's collator); the
expected values come from scoring each candidate with a plain full log-softmax and
picking chosen and rejected by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from pofe.trainers.metrics import MetricWindow, pair_metrics

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


def _floats(pairs):
    return {k: float(v) for k, v in pairs.values.items()}, int(pairs.num_pairs)


def test_pair_metrics_by_hand():
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
    values, n = _floats(pair_metrics(logp, reward, preference, mask))
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
    values, n = _floats(
        pair_metrics(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2, dtype=bool))
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
    """What one compute_loss call logs: the trainer's `log` at the next logging step (one value each)."""
    trainer.model.train(split == "train")
    trainer.compute_loss(trainer.model, inputs)
    logged = {}
    trainer.callback_handler.on_log = lambda args, state, control, logs: logged.update(logs) or control
    trainer.log({"loss" if split == "train" else "eval_loss": 0.0})
    return logged


@pytest.mark.trl
@pytest.mark.parametrize("split", ["train", "eval"])
def test_rrhf_trainer_logs_its_scores_under_its_own_names(
    batch_and_logps, tiny64_model, tokenizer, tmp_path, split, one_torch_thread
):
    """RRHF's pair metrics are its scores logp / n ** 0.5 for the best- and worst-reward
    candidate (prompt 0: slots 1 and 2, prompt 1: slots 1 and 0; prompt 2 ties: left out):
    rrhf/worst_score, rrhf/score_margin, rrhf/best_above_worst, not TRL's rewards/* (issue 44:
    TRL's rewards are beta-scaled log-ratios to a reference RRHF has none of); logps/* are
    TRL's quantity (summed log-probs of chosen and rejected) and keep TRL's names.
    rrhf/best_score is the loss's, over all 3 prompts (prompt 2's best: slot 0, the first of
    the tie)."""
    from pofe.trainers import RRHFTrainer

    batch, logps, _ = batch_and_logps
    trainer = _trainer(
        RRHFTrainer, tiny64_model, tokenizer, tmp_path, {"method": "rrhf", "length_penalty": LENGTH_PENALTY}
    )
    stored = _stored(trainer, dict(batch), split)
    score = lambda row, i: row[i][0] / row[i][1] ** LENGTH_PENALTY  # noqa: E731
    trl = _expected(logps, score, REWARDS)
    expected = {
        "rrhf/worst_score": trl["rewards/rejected"],
        "rrhf/score_margin": trl["rewards/margins"],
        "rrhf/best_above_worst": trl["rewards/accuracies"],
        "logps/chosen": trl["logps/chosen"],
        "logps/rejected": trl["logps/rejected"],
        "rrhf/best_score": (score(logps[0], 1) + score(logps[1], 1) + score(logps[2], 0)) / 3,
    }
    prefix = "" if split == "train" else "eval_"
    for name, value in expected.items():
        assert stored[prefix + name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert not [k for k in stored if k.startswith(f"{prefix}rewards/")]


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

    from pofe.trainers.k_response import KResponseTrainer

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=600)
    )
    try:
        rows = slice(0, 2) if rank == 0 else slice(2, 5)
        pairs = pair_metrics(*(t[rows] for t in _pair_batch()))
        trainer = SimpleNamespace(args=SimpleNamespace(device=torch.device("cpu")), metric_window=MetricWindow())
        KResponseTrainer.log_stats(
            trainer,
            SimpleNamespace(training=False),
            "rrhf",
            {"rank": float(rank)},
            rows.stop - rows.start,
            pairs=pairs,
        )
        torch.save(trainer.metric_window.flush("eval", torch.device("cpu")), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_pair_metrics_are_means_over_every_ranks_pairs(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    expected, n = _floats(pair_metrics(*_pair_batch()))  # one process, all 5 prompts: 3 pairs
    assert n == 3
    for rank in range(2):
        stored = torch.load(tmp_path / f"rank{rank}.pt")
        assert stored["eval_rrhf/rank"] == pytest.approx(3 / 5)  # 0 x 2 prompts + 1 x 3 prompts
        for name, value in expected.items():
            assert stored[f"eval_{name}"] == pytest.approx(value, rel=1e-6), name


def test_a_mean_of_zero_is_logged_as_0_not_minus_0():
    """SPPO's mean target is 0 by construction with every candidate kept; when its float comes
    out as -0.0 the log showed 'sppo/target': '-0' (transformers formats with .4g). Logged: +0.0."""
    import math

    window = MetricWindow()
    window.add("train", {"sppo/target": (torch.tensor(-0.0), 4), "sppo/loss": (2.0, 4)}, "cpu")
    logged = window.flush("train", "cpu")
    assert logged == {"sppo/loss": 2.0, "sppo/target": 0.0}
    assert math.copysign(1.0, logged["sppo/target"]) == 1.0 and f"{logged['sppo/target']:.4g}" == "0"


def test_window_is_the_mean_over_every_prompt_since_the_last_log():
    """Three steps before one log: a (2 prompts) 1.0, 4.0 (3 prompts), NaN (1 prompt: weighs 0)
    -> (2 x 1 + 3 x 4) / 5 = 2.8, not the mean of step means (2.5); b first appears at step 2
    with 6.0 over 3 prompts and 0.0 over 1 -> 18 / 4 = 4.5; c has only NaN: left out. Each
    split has its own window, evaluation's named eval_*; a flush empties the window."""
    window = MetricWindow()
    window.add("train", {"a": (torch.tensor(1.0), 2)}, "cpu")
    window.add("train", {"a": (torch.tensor(4.0), 3), "b": (torch.tensor(6.0), torch.tensor(3.0))}, "cpu")
    window.add("train", {"a": (float("nan"), 1), "b": (0.0, 1), "c": (torch.tensor(float("nan")), 5)}, "cpu")
    window.add("eval", {"a": (7.0, 1)}, "cpu")
    assert window.flush("train", "cpu") == pytest.approx({"a": 2.8, "b": 4.5})
    assert window.flush("train", "cpu") == {}
    assert window.flush("eval", "cpu") == {"eval_a": 7.0}


# ---- host synchronisations: the losses' statistics are read once per logging step ------

# Tensor methods that make the host wait for the device (a value read, or a shape that
# depends on values)
SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy")


class SyncCounter:
    """Counts the calls of `SYNCS` on tensors, each under the POFE module that made it (the
    innermost caller frame in a `pofe` module): on the CPU they are free, on a GPU each is a
    stall, so the count is what a GPU step would wait for."""

    def __init__(self, monkeypatch):
        from collections import Counter

        self.calls = Counter()
        for name in SYNCS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))

    def _counted(self, name, original):
        import sys

        def counted(tensor, *args, **kwargs):
            frame = sys._getframe(1)
            while frame is not None and not frame.f_globals.get("__name__", "").startswith("pofe"):
                frame = frame.f_back
            where = frame.f_globals["__name__"] if frame is not None else "outside pofe"
            self.calls[where] += 1
            return original(tensor, *args, **kwargs)

        return counted

    def take(self) -> dict[str, int]:
        out = dict(self.calls)
        self.calls.clear()
        return out


# a Nash-MD recipe's `pofe:` block (its online refresh is not run here: the batch carries what it would write)
NASH_MD = {
    "method": "nash_md",
    "generate": {"backend": "transformers", "num_candidates": 3, "temperature": 1.0, "max_new_tokens": 4},
    "judge": {"type": "python", "function": "pofe.demo.task:reward", "preferences": "hard"},
    "online": {"refresh_every": 1, "kl_coef": 0.1},
}


@pytest.mark.parametrize("method", ["rrhf", "sppo", "nash_md"])
def test_a_step_reads_its_statistics_on_the_host_once_per_log(
    batch_and_logps, tiny64_model, tokenizer, tmp_path, method, monkeypatch, one_torch_thread
):
    """Issue 42: the losses called `.item()` on every statistic and the trainers on every pair
    metric: 18 (RRHF: 10 in the loss, 7 pair metrics, 1 check) and 13 (SPPO: 5, 7, 1) reads of
    device tensors a step, besides the scoring's (and, with several ranks, one per logged name
    after each step's collective). Now: one in the loss (its value checks: one flag), one in
    `check_finite` (a NaN must stop the step it appears in), none in the pair metrics or in
    `log_stats`; the statistics are read in one `tolist` when transformers logs, however many
    steps the window holds. The scoring's own (packed-row shapes read from the mask) are
    counted apart and left as they are. Issue 51: Nash-MD's trainer read 9 a step (4 `.item()`,
    3 boolean-mask gathers, the loss's check, `check_finite`); it now takes the (B, K) batch and
    its mask as SPPO's loss does."""
    from pofe.columns import PI_0_LOGPS
    from pofe.trainers import RRHFTrainer, SPPOTrainer
    from pofe.trainers.nash_md import NashMDTrainer

    batch = dict(batch_and_logps[0])
    trainers = {"rrhf": RRHFTrainer, "sppo": SPPOTrainer, "nash_md": NashMDTrainer}
    pofe = {"rrhf": {"method": "rrhf"}, "sppo": {"method": "sppo", "eta": ETA}, "nash_md": NASH_MD}[method]
    if method == "nash_md":  # what its refresh writes: each sample's preference and log pi_0
        batch["preferences"] = torch.full(batch["candidate_mask"].shape, 0.75)
        batch[PI_0_LOGPS] = torch.full(batch["candidate_mask"].shape, -5.0)
    trainer = _trainer(trainers[method], tiny64_model, tokenizer, tmp_path, pofe)
    trainer.model.train()
    trainer.compute_loss(trainer.model, batch)  # SPPO's first step computes its anchor table
    trainer.metric_window = MetricWindow()
    counter = SyncCounter(monkeypatch)
    steps = 3
    for _ in range(steps):
        trainer.compute_loss(trainer.model, batch)
    per_step = {k: v / steps for k, v in counter.take().items()}
    trainer.callback_handler.on_log = lambda args, state, control, logs: control
    trainer.log({"loss": 0.0})
    logged = counter.take()
    assert per_step.pop(f"pofe.losses.{method}") == 1
    assert per_step.pop("pofe.trainers.k_response") == 1
    assert not [m for m in per_step if m.startswith("pofe.trainers") or m.startswith("pofe.losses")], per_step
    assert logged.get("pofe.trainers.metrics") == 1, logged
