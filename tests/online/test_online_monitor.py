"""The online monitor without training (`pofe.online.monitor`): which refreshes it measures, the
held-out references it reads, the perplexity, the completions it shows, its file and the
tracker's table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from axolotl.utils.dict import DictDefault

from pofe.args import pofe_config
from pofe.online.monitor import (
    FILE,
    Monitor,
    completions,
    console_lines,
    log_table,
    perplexity,
    reference_rows,
    write_record,
)
from pofe.records.refresh import refresh_dir
from tests.helpers import pofe_block


def _raw(tmp_path: Path, **eval_block) -> dict:
    return {
        "rl": "rrhf",
        "datasets": [{"path": str(tmp_path / "prompts.jsonl"), "type": "pofe.prompts"}],
        "pofe": {**pofe_block("rrhf"), "online": {}, "eval": eval_block},
    }


def _cfg(raw: dict) -> DictDefault:
    cfg = DictDefault(raw)
    cfg.datasets = [DictDefault(d) for d in raw["datasets"]]
    return cfg


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_perplexity_by_hand():
    # two responses of 2 and 3 tokens, summed log-probs -2 and -4: exp(6 / 5)
    assert perplexity([-2.0, -4.0], [2, 3]) == pytest.approx(math.exp(6 / 5), rel=1e-12)


def test_every_nth_refresh_is_monitored_from_the_first(tmp_path):
    """monitor_every 3: refreshes 1, 4, 7 (counted by the refresh folders before this one); 0: none."""

    def due(every: int, steps: list[int]) -> list[bool]:
        out = tmp_path / f"every-{every}"
        pofe = pofe_config({"rl": "rrhf", "pofe": {**pofe_block("rrhf"), "online": {"monitor_every": every}}})
        monitor = Monitor(None, pofe, str(out), tokenize=None, score=None, main=True, report_to=[])
        answers = []
        for step in steps:
            answers.append(monitor.due(step))
            refresh_dir(out, step).mkdir(parents=True)  # the refresh writes its folder
        return answers

    steps = list(range(0, 24, 3))  # refreshes 1..8
    assert due(3, steps) == [True, False, False, True, False, False, True, False]
    assert due(1, steps) == [True] * 8
    assert due(0, steps) == [False] * 8


def test_references_are_the_held_out_prompts_answers_as_eval_reads_them(tmp_path):
    """From a `pofe.eval.prompts` file (a sum such as "32" stays text: POFE's JSON reader), and
    from the last `pofe.eval.held_out` rows of the dataset; a row without a reference is left out."""
    held = _write(
        tmp_path / "held.jsonl", [{"q": "1+2=", "answer": "3"}, {"q": "2+30=", "answer": "32"}, {"q": "5+5="}]
    )
    raw = _raw(tmp_path, prompts=str(held), prompt_column="q", reference_column="answer")
    rows, source = reference_rows(_cfg(raw), pofe_config(raw))
    assert source == f"{held} (pofe.eval.prompts)"
    assert rows == [
        {"prompt": [{"role": "user", "content": "1+2="}], "responses": [{"role": "assistant", "content": "3"}]},
        {"prompt": [{"role": "user", "content": "2+30="}], "responses": [{"role": "assistant", "content": "32"}]},
    ]

    _write(tmp_path / "prompts.jsonl", [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(5)])
    raw = _raw(tmp_path, held_out=2, reference_column="answer")
    rows, source = reference_rows(_cfg(raw), pofe_config(raw))
    assert source == f"the last 2 rows of {tmp_path / 'prompts.jsonl'} (pofe.eval.held_out)"
    assert [(r["prompt"][0]["content"], r["responses"][0]["content"]) for r in rows] == [("3+1=", "4"), ("4+1=", "5")]
    assert reference_rows(_cfg(_raw(tmp_path)), pofe_config(_raw(tmp_path))) == ([], "")


def test_completions_are_the_policys_samples_of_the_first_prompts_with_their_judgements():
    """The dataset's answer "3" and a sample "3" are one text: the judged row's second "3" is the
    sample (the judge keeps the generated order); the second prompt is past `count`."""
    generated = [
        {
            "candidates": ["3", "4", "3", "x!"],
            "sources": ["answer", "policy", "policy", "policy"],
            "finish_reasons": [None, "stop", "stop", "length"],
        },
        {"candidates": ["9", "8"], "sources": ["answer", "policy"], "finish_reasons": [None, "stop"]},
    ]
    judged = [
        {"index": 5, "prompt": "1+2=", "responses": ["3", "4", "3", "x!"], "rewards": [1.0, 0.25, 1.0, 0.0]},
        {"index": 2, "prompt": "4+5=", "responses": ["9", "8"], "rewards": [1.0, 0.25]},
    ]
    second = [{"index": 5, "responses": ["4", "3", "x!"], "rewards": [0.5, 0.9, 0.1], "win_rates": None}]
    shown = completions(generated, judged, 1, {5: {"3": 9.0, "4": 1.5}}, second)
    assert shown == [
        {
            "prompt": "1+2=",
            "completion": "4",
            "finish_reason": "stop",
            "reward": 0.25,
            "logratio_to_pi_0": 1.5,
            "judge2_reward": 0.5,
        },
        {
            "prompt": "1+2=",
            "completion": "3",
            "finish_reason": "stop",
            "reward": 1.0,
            "logratio_to_pi_0": 9.0,
            "judge2_reward": 0.9,
        },
        {"prompt": "1+2=", "completion": "x!", "finish_reason": "length", "reward": 0.0, "judge2_reward": 0.1},
    ]
    assert [r["completion"] for r in completions(generated, judged, 2, {})] == ["4", "3", "x!", "8"]


def test_the_console_counts_identical_completions_and_shows_the_most_frequent_of_each_prompt():
    """'1+2=': "3" three times (win rates 0.75, 0.5, 1.0 against three opponents: mean 0.75), "5"
    and "7" twice (win rates 0 and 0.5: 0.25), "4", "x" and "6" once: the 4 most frequent, ties in
    sampled order ("4" before "x" and "6"), and a line counting the other 2 (2 samples). '4+5='
    (chat messages: the last one's text) has one sample."""
    rows = [("4", 0.0, 0.25), ("3", 1.0, 0.75), ("3", 1.0, 0.5), ("x", 0.0, 0.25), ("3", 1.0, 1.0)]
    rows += [("5", 0.0, 0.0), ("5", 0.0, 0.5), ("6", 0.0, 0.25), ("7", 0.0, 0.5), ("7", 0.0, 0.0)]
    records = [{"prompt": "1+2=", "completion": c, "reward": r, "win_rate": w} for c, r, w in rows]
    records.append({"prompt": [{"role": "user", "content": "4+5="}], "completion": "9", "reward": 1.0})
    assert console_lines(records) == [
        "  '1+2=' -> '3' x3: reward 1.000, win_rate 0.750",
        "  '1+2=' -> '5' x2: reward 0.000, win_rate 0.250",
        "  '1+2=' -> '7' x2: reward 0.000, win_rate 0.250",
        "  '1+2=' -> '4': reward 0.000, win_rate 0.250",
        "  '1+2=' -> 2 other completions (2 samples)",
        "  '4+5=' -> '9': reward 1.000",
    ]


def test_the_file_holds_one_record_per_refresh_and_a_resumed_run_replaces_the_later_ones(tmp_path):
    for step in (0, 3, 6):
        write_record(tmp_path, step, step // 3 + 1, {"reference_perplexity": 10.0 - step}, [{"completion": "1"}])
    write_record(tmp_path, 3, 2, {}, [])  # resumed before step 3: steps 3 and 6 are sampled again
    records = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()]
    assert records == [
        {"step": 0, "refresh": 1, "reference_perplexity": 10.0, "completions": [{"completion": "1"}]},
        {"step": 3, "refresh": 2, "reference_perplexity": None, "completions": []},
    ]


def test_the_completions_reach_trackio_as_a_table(tmp_path, monkeypatch):
    """trackio (installed with axolotl) keeps what `log_table` logs in its local database; read back
    through its own storage. Its folder is bound at import (TRACKIO_DIR), so it is moved to
    tmp_path where each of its modules holds it."""
    import trackio
    import trackio.sqlite_storage
    import trackio.utils

    for module in (trackio, trackio.sqlite_storage, trackio.utils):
        monkeypatch.setattr(module, "TRACKIO_DIR", tmp_path)
    trackio.init(project="pofe-monitor", name="run")
    try:
        log_table(["trackio"], 7, [{"prompt": "1+2=", "completion": "!!!", "reward": 1.2}])
    finally:
        trackio.finish()
    (log,) = trackio.sqlite_storage.SQLiteStorage.get_logs("pofe-monitor", "run")
    table = log["online/completions"]
    assert table["_type"] == "trackio.table"
    assert table["_value"] == [{"step": 7, "prompt": "1+2=", "completion": "!!!", "reward": 1.2}]
    assert list(tmp_path.glob("pofe-monitor*.db"))  # written where the test put it
