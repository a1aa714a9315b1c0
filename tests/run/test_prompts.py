"""Which prompts each round trains on and which are held out (`pofe.run.prompts`): splits, the
default held-out slice, and `pofe.round_prompts` naming dataset specs as a `datasets:` entry
does (path, name, split, data_files): a folder of data files, a `save_to_disk` folder, a
dataset repo's folder loaded by path as a hub id is; a spec that does not load names its round."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset, DatasetDict

from pofe.args import PofeConfig
from pofe.args.rounds import RoundPromptSet
from pofe.run.prompts import load_round_prompts, resolve_round_prompts, split_prompts
from tests.helpers import prompts_in, prompts_stage

# a dataset repo's README: two configurations, each with a train and a test split
CARD = """---
configs:
- config_name: iter1
  data_files:
  - {split: train, path: iter1/train.jsonl}
  - {split: test, path: iter1/test.jsonl}
- config_name: iter2
  data_files:
  - {split: train, path: iter2/train.jsonl}
  - {split: test, path: iter2/test.jsonl}
---
"""


def _jsonl(path, prompts):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt-sets")
    repo = root / "repo"
    for name in ("iter1", "iter2"):
        for split in ("train", "test"):
            _jsonl(repo / name / f"{split}.jsonl", [f"{name}-{split}-{i}" for i in range(3)])
    (repo / "README.md").write_text(CARD)
    files = root / "files"
    _jsonl(files / "a.jsonl", ["a0", "a1"])
    _jsonl(files / "b.jsonl", ["b0"])
    saved = root / "saved"
    DatasetDict(
        {
            "train": Dataset.from_dict({"prompt": ["s0", "s1"]}),
            "eval": Dataset.from_dict({"prompt": ["e0", "e1", "e2", "e3"]}),
        }
    ).save_to_disk(str(saved))
    return {"repo": str(repo), "files": str(files), "saved": str(saved)}


ENTRY = {"path": "unused.jsonl", "type": "pofe.prompts"}


def _prompts(rounds):
    return [[r["prompt"] for r in rows] for rows in rounds]


def test_dataset_specs_load_as_datasets_entries_do(sources):
    specs = [
        RoundPromptSet(path=sources["repo"], name="iter2", split="test"),  # a repo's config and split
        RoundPromptSet(path=sources["repo"], name="iter1"),  # split: train by default
        # a folder with data_files, which axolotl reads with datasets' json builder (paths as given)
        RoundPromptSet(path=sources["files"], data_files=f"{sources['files']}/b.jsonl"),
        RoundPromptSet(path=sources["saved"], split="eval"),  # a save_to_disk folder of splits
    ]
    got = _prompts(load_round_prompts(ENTRY, specs, False))
    assert got == [
        ["iter2-test-0", "iter2-test-1", "iter2-test-2"],
        ["iter1-train-0", "iter1-train-1", "iter1-train-2"],
        ["b0"],
        ["e0", "e1", "e2", "e3"],
    ]


def test_bad_specs_name_the_round_and_the_spec(sources):
    with pytest.raises(
        ValueError,
        match=r"round_prompts\[1\] \(round 2\): dataset path='.*repo', name='iter9'.* "
        r"does not load",
    ):
        load_round_prompts(
            ENTRY,
            [RoundPromptSet(path=sources["repo"], name="iter1"), RoundPromptSet(path=sources["repo"], name="iter9")],
            False,
        )
    with pytest.raises(
        ValueError,
        match=r"round_prompts\[0\] \(round 1\): dataset path='.*saved', split='test' has "
        r"splits \['eval', 'train'\], not 'test': set `split`",
    ):
        load_round_prompts(ENTRY, [RoundPromptSet(path=sources["saved"], split="test")], False)
    with pytest.raises(
        ValueError,
        match=r"round_prompts\[0\] \(round 1\): dataset path='nobody/nothing'.* does not "
        r"load .*hf auth login",
    ):
        load_round_prompts(ENTRY, [RoundPromptSet(path="nobody/nothing")], False)
    with pytest.raises(ValueError, match=r"unknown key 'splitt' \(did you mean 'split'\?\)"):
        PofeConfig(rounds=1, round_prompts=[{"path": "x", "splitt": "train"}])


def test_a_run_mixes_files_and_specs_one_per_round(sources, tmp_path):
    base = tmp_path / "base.jsonl"
    _jsonl(base, ["h0", "h1", "h2"])
    pofe = {
        "rounds": 2,
        "eval": {"held_out": 1},
        "round_prompts": [f"{sources['files']}/a.jsonl", {"path": sources["repo"], "name": "iter2"}],
        "generate": {"backend": "transformers"},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    }
    folder, _, _ = prompts_stage(tmp_path, "rrhf", base, pofe)
    assert prompts_in(folder.round_prompts(1)) == ["a0", "a1"]
    assert prompts_in(folder.round_prompts(2)) == ["iter2-train-0", "iter2-train-1", "iter2-train-2"]
    assert prompts_in(folder.held_out_prompts) == ["h2"]


def test_held_out_prompts_leave_a_round_set_drawn_from_the_same_pool(sources, tmp_path):
    """The SPPO recipes read one hub set as the `datasets:` entry (whose last rows are the
    default held-out slice) and as round 1's prompts: round 1 must not train on the slice.
    A pool of 20 holds out its last 4 (a fifth of a small pool); round 2's set shares none."""
    pool = tmp_path / "pool.jsonl"
    _jsonl(pool, [f"p{i}" for i in range(20)])
    pofe = {
        "rounds": 2,
        "round_prompts": [str(pool), f"{sources['files']}/a.jsonl"],
        "generate": {"backend": "transformers"},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    }
    folder, state, said = prompts_stage(tmp_path, "sppo", pool, pofe)
    assert prompts_in(folder.held_out_prompts) == ["p16", "p17", "p18", "p19"]
    assert prompts_in(folder.round_prompts(1)) == [f"p{i}" for i in range(16)]
    assert prompts_in(folder.round_prompts(2)) == ["a0", "a1"]
    assert state.stages["prompts"]["held_out_removed"] == [4, 0]
    assert any("per round: [4, 0]" in line for line in said)


def test_split_prompts_disjoint_and_covering():
    """10 prompts over 3 rounds: sizes 4, 3, 3; disjoint; together every prompt once."""
    parts = split_prompts(10, 3, "split")
    assert [list(p) for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [list(p) for p in split_prompts(5, 2, "all")] == [list(range(5))] * 2
    with pytest.raises(ValueError, match="cannot be split"):
        split_prompts(2, 3, "split")


def test_auto_round_prompts():
    assert resolve_round_prompts("sppo", "auto") == "split"
    assert resolve_round_prompts("rrhf", "auto") == "all"
    assert resolve_round_prompts("rrhf", "split") == "split"


def test_default_held_out_size_by_hand():
    """5 % of the pool, at least 16, at most 256, never more than a fifth of the pool."""
    from pofe.run.prompts import default_held_out, held_out_count

    by_hand = {0: 0, 4: 0, 5: 1, 14: 2, 40: 8, 80: 16, 100: 16, 320: 16, 339: 17, 1000: 50, 5120: 256, 100000: 256}
    assert {n: default_held_out(n) for n in by_hand} == by_hand
    assert held_out_count(100, None, has_own_prompts=False) == 16
    assert held_out_count(100, 0, has_own_prompts=False) == 0  # `held_out: 0`: off
    assert held_out_count(100, 30, has_own_prompts=False) == 30
    assert held_out_count(100, None, has_own_prompts=True) == 0  # the recipe's own held-out file
    with pytest.raises(ValueError, match="held_out=14 leaves none of the 14 prompts"):
        held_out_count(14, 14, has_own_prompts=False)


@pytest.mark.parametrize(
    ("pool", "eval_keys", "held"),
    [(100, None, 16), (14, None, 2), (4, None, 0), (100, {"held_out": 0}, 0), (100, {"held_out": 7}, 7)],
)
def test_held_out_rows_never_reach_a_round(tmp_path, pool, eval_keys, held):
    """The prompts stage holds out the pool's last rows (the default slice with no eval keys):
    no round's prompt file holds any of them; `held_out: 0` writes no held-out file."""
    from tests.helpers import prompts_in, prompts_stage

    base = tmp_path / "pool.jsonl"
    base.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(pool)))
    pofe = {
        "rounds": 2,
        "generate": {"backend": "transformers"},
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
        **({"eval": eval_keys} if eval_keys else {}),
    }
    folder, _, _ = prompts_stage(tmp_path, "sppo", base, pofe)
    trained = prompts_in(folder.round_prompts(1)) + prompts_in(folder.round_prompts(2))
    assert trained == [f"p{i}" for i in range(pool - held)]  # SPPO's split: every other row once
    if held:
        assert prompts_in(folder.held_out_prompts) == [f"p{i}" for i in range(pool - held, pool)]
    else:
        assert not folder.held_out_prompts.exists()
