"""summary.json's numbers that the run report reads (`pofe_candidates.build`), worked by hand, and
its record (`pofe.records.candidates`) refusing a file of another form."""

from __future__ import annotations

import json

import pytest

from pofe.files import UnreadableFile
from pofe.records.candidates import CandidatesSummary
from pofe_candidates.build import candidate_lengths, policy_sample_rewards
from tests.helpers import write_summary


def _generated(index, candidates, sources, tokens, dropped=None):
    return {
        "index": index,
        "candidates": candidates,
        "sources": sources,
        "candidate_tokens": tokens,
        "dropped": dropped,
    }


GENERATED = [
    _generated(0, ["a", "bb", "ccc"], ["policy", "policy", "dataset"], [1, 2, 3]),
    _generated(1, ["d", "ee"], ["dataset", "policy"], [4, 6]),
    _generated(2, [], [], [], dropped="max_prompt_tokens"),
    _generated(3, ["f", "g"], ["policy", "policy"], [5, 9]),
]
JUDGED = [
    {"index": 0, "responses": ["a", "bb", "ccc"], "rewards": [0.5, 1.0, 2.0]},
    {"index": 1, "responses": ["d", "ee"], "rewards": [3.0, -1.0]},
    {"index": 3, "responses": ["f", "g"], "rewards": [0.0, 0.0]},  # tied: no best or worst
]


def test_policy_samples_mean_reward_leaves_the_datasets_responses_out():
    """Policy samples: a 0.5, bb 1.0 (row 0), ee -1.0 (row 1), f 0.0 and g 0.0 (row 3); the
    dataset's ccc and d are left out."""
    assert policy_sample_rewards(GENERATED, JUDGED) == [0.5, 1.0, -1.0, 0.0, 0.0]


def test_candidate_lengths_of_all_and_of_each_prompts_best_and_worst():
    """All 7 candidates: 1, 2, 3, 4, 6, 5, 9 tokens (mean 30/7, median 4). Best: ccc (3) and d (4);
    worst: a (1) and ee (6); row 3 ties and gives neither."""
    live = [g for g in GENERATED if g["dropped"] is None]
    lengths = candidate_lengths(live, JUDGED, "rewards")
    assert lengths.candidates.mean == pytest.approx(30 / 7) and lengths.candidates.median == 4.0
    assert lengths.candidates.count == 7
    assert (lengths.best.mean, lengths.best.count) == (3.5, 2)
    assert (lengths.worst.mean, lengths.worst.median, lengths.worst.count) == (3.5, 3.5, 2)
    assert candidate_lengths([], [], "rewards") is None


def test_summary_of_another_form_is_refused_naming_what_rewrites_it(tmp_path):
    """An older POFE's summary.json (no `format`) and one missing a field are refused, each naming
    the file and the fix; the pipeline's own reads back whole."""
    from pofe.run.folder import RunFolder

    folder = RunFolder(tmp_path)
    written = write_summary(folder, 1, rows=3)
    assert CandidatesSummary.read(folder.summary(1), "fix").rows == 3
    older = {k: v for k, v in written.items() if k not in ("format", "lengths", "mean_policy_sample_reward")}
    folder.summary(1).write_text(json.dumps(older))
    with pytest.raises(UnreadableFile, match=r"summary.json is in another form .*format 1, unrecorded.* rewrite"):
        CandidatesSummary.read(folder.summary(1), "rewrite it.")
    folder.summary(1).write_text(json.dumps({k: v for k, v in written.items() if k != "rows"}))
    with pytest.raises(UnreadableFile, match=r"summary.json: field 'rows': Field required .* rewrite"):
        CandidatesSummary.read(folder.summary(1), "rewrite it.")
