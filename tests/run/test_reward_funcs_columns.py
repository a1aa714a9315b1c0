"""The docs' reward functions on a user's path (issue 44): `my_rewards.py` beside the recipe, its
`correct_answer(prompts, completions, answer, **kwargs)` reading the dataset's `answer` column,
through `axolotl pofe run` (its stages in processes of their own) and `axolotl pofe eval`, run
from another directory with nothing on PYTHONPATH; and the online refresh's judging with the
rows' columns."""

from __future__ import annotations

import contextlib
import json
import re
import sys

import pytest
import yaml

from pofe.run.folder import RunFolder
from tests.helpers import ROOT, run_axolotl, run_state, write_rounds_recipe

DOC = (ROOT / "docs" / "candidates.md").read_text()
# nothing on the import path but the venv's: no PYTHONPATH, no recipe folders a parent recorded
CLEAN = {"PYTHONPATH": "", "POFE_RECIPE_DIRS": ""}


def docs_example() -> tuple[dict, str]:
    """The docs' `reward_funcs` judge block (the one under "Reward functions you already have")
    and its `my_rewards.py`, as written there."""
    section = DOC[DOC.index("## Reward functions you already have") :]
    block = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    code = re.search(r"```python\n(# my_rewards.py\n.*?)```", section, re.S).group(1)
    return block["pofe"]["judge"], code


def expected_reward(module, text: str, row: dict) -> float:
    """The docs' judge on one completion, its functions called directly with the row's columns:
    sum of weight x value (reward_weights 1.0 and 0.2) over the functions that gave one."""
    columns = {k: [v] for k, v in row.items() if k != "prompt"}
    values = [
        module.correct_answer([row["prompt"]], [text], **columns)[0],
        module.format_ok([row["prompt"]], [text])[0],
    ]
    return sum(w * v for w, v in zip((1.0, 0.2), values) if v is not None)


@pytest.fixture(scope="module")
def docs_run(tmp_path_factory, tiny_model):
    """One round of RRHF judged by the docs' example, its evaluation holding 4 rows out, run
    from an empty directory (the module is found beside the recipe only)."""
    root = tmp_path_factory.mktemp("reward_funcs")
    judge, code = docs_example()
    recipe_dir, elsewhere = root / "recipe", root / "elsewhere"
    recipe_dir.mkdir()
    elsewhere.mkdir()
    recipe = write_rounds_recipe(recipe_dir, tiny_model, "rrhf")
    raw = yaml.safe_load(recipe.read_text())
    raw["num_epochs"] = 1
    raw["pofe"] |= {"rounds": 1, "judge": judge}
    recipe.write_text(yaml.safe_dump(raw))
    (recipe_dir / "my_rewards.py").write_text(code)
    run_axolotl("pofe", "run", str(recipe), "--launcher", "python", "--quiet", cwd=elsewhere, env=CLEAN)
    sys.path.insert(0, str(recipe_dir))  # the test's own calls of the example
    try:
        import my_rewards
    finally:
        sys.path.remove(str(recipe_dir))
        sys.modules.pop("my_rewards", None)
    folder = RunFolder(recipe_dir / "run")
    first = [json.loads(line) for line in (folder.eval_dir / "samples.jsonl").read_text().splitlines()]
    return {"root": root, "raw": raw, "recipe_dir": recipe_dir, "folder": folder, "module": my_rewards, "first": first}


@pytest.mark.e2e
def test_the_run_judges_candidates_and_evaluates_with_the_answer_column(docs_run):
    """Every stage finished; the candidates' rewards (the dataset's own answer among them, 1.0 +
    0.2), each held-out answer's and each held-out candidate's reward, and each headline
    answer's are the docs' functions called with that prompt's own row."""
    folder, module = docs_run["folder"], docs_run["module"]
    assert all(s["status"] == "done" for s in run_state(folder.root)["stages"].values())
    pool = {
        r["prompt"]: r for r in map(json.loads, (docs_run["recipe_dir"] / "prompts.jsonl").read_text().splitlines())
    }
    data = [json.loads(line) for line in (folder.candidates(1) / "data.jsonl").read_text().splitlines()]
    for row in data:
        assert row["rewards"] == pytest.approx(
            [expected_reward(module, t, pool[row["prompt"]]) for t in row["responses"]]
        )
        assert 1.2 in row["rewards"]  # the row's own answer: right (1.0) and a number (0.2)
    held = [json.loads(line) for line in folder.held_out_prompts.read_text().splitlines()]
    assert len(held) == 4 and all("answer" in r for r in held)
    for s in docs_run["first"]:
        assert s["reward"] == pytest.approx(expected_reward(module, s["response"], held[s["prompt_index"]]))
    for c in map(json.loads, (folder.eval_dir / "candidates.jsonl").read_text().splitlines()):
        assert c["reward"] == pytest.approx(expected_reward(module, c["response"], held[c["prompt_index"]]))
    headline = json.loads((folder.eval_dir / "headline.json").read_text())["rounds"]["1"]["samples"]
    assert headline
    for s in headline:
        assert s["reward"] == pytest.approx(expected_reward(module, s["completion"], pool[s["prompt"]]))


@pytest.mark.e2e
def test_eval_prompts_file_columns_reach_the_judge(docs_run):
    """`axolotl pofe eval` of the same run with `pofe.eval.prompts`: a file of the held-out
    prompts whose `answer` is pi_0's first answer to each (the stored answers, sampled again
    alike). Run from the folder holding my_rewards.py, the recipe elsewhere (the working
    directory's module): pi_0's first answers now score 1.0 (+ 0.2 when a number), which
    they can only if each prompt's own column reached the judge."""
    module, folder = docs_run["module"], docs_run["folder"]
    first = {s["prompt_index"]: s for s in docs_run["first"] if s["model"] == "pi_0" and s["sample"] == 0}
    rows = [{"prompt": first[p]["prompt"], "answer": first[p]["response"].strip()} for p in sorted(first)]
    other = docs_run["root"] / "other"
    other.mkdir()
    (other / "eval_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = json.loads(json.dumps(docs_run["raw"]))
    raw["pofe"]["eval"] = {k: v for k, v in raw["pofe"]["eval"].items() if k != "held_out"}
    raw["pofe"]["eval"]["prompts"] = str(other / "eval_prompts.jsonl")
    (other / "recipe.yml").write_text(yaml.safe_dump(raw))
    run_axolotl("pofe", "eval", str(other / "recipe.yml"), cwd=docs_run["recipe_dir"], env=CLEAN)
    samples = [json.loads(line) for line in (folder.eval_dir / "samples.jsonl").read_text().splitlines()]
    assert {s["prompt"] for s in samples} == {r["prompt"] for r in rows}
    for s in samples:
        assert s["reward"] == pytest.approx(expected_reward(module, s["response"], rows[s["prompt_index"]]))
    again = [s for s in samples if s["model"] == "pi_0" and s["sample"] == 0]
    assert len(again) == len(rows) and all(s["reward"] >= 1.0 for s in again)


def test_an_online_refresh_judges_with_the_rows_columns(tiny_model, tmp_path):
    """A refresh's judging (`sample_and_judge`) hands the reward functions each prompt row's
    other columns: with fixed candidates ("7", "8", "x") and answers "7" and "8", the rewards are
    (1.2, 0.2, 0) and (0.2, 1.2, 0)."""
    from pofe.methods import method_spec
    from pofe.online.refresh import RefreshContext, Window, sample_and_judge
    from pofe_candidates.config import CandidatesConfig, GenerateConfig, JudgeConfig
    from pofe_candidates.judges import make_judge
    from pofe_candidates.models import load_tokenizer

    judge_cfg, code = docs_example()
    (tmp_path / "my_rewards.py").write_text(code)
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = JudgeConfig(**judge_cfg)

        class Fixed:
            def generate(self, prompts, n, sampling):
                return [["7", "8", "x"] for _ in prompts]

        rows = {0: {"prompt": "3+4=", "answer": "7"}, 1: {"prompt": "4+4=", "answer": "8"}}
        _, judged = sample_and_judge(
            Window(0, [[0, 1]]),
            rows,
            RefreshContext(
                generator=Fixed(),
                judge=make_judge(cfg),
                tokenizer=load_tokenizer(str(tiny_model)),
                method=method_spec("rrhf"),
                generate=GenerateConfig(num_candidates=3, max_new_tokens=4, dedupe=False),
                judge_cfg=cfg,
                candidates=CandidatesConfig(progress=False),
                timer=lambda stage: contextlib.nullcontext(),
            ),
        )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_rewards", None)
    assert [r["rewards"] for r in sorted(judged, key=lambda r: r["index"])] == [[1.2, 0.2, 0.0], [0.2, 1.2, 0.0]]
