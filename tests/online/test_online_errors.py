"""An online run's failures as `axolotl train` shows them (issue 50's still-weak cases): each names
the file, the row or the path concerned, and what to do."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import ROOT, run_axolotl
from tests.online.test_online_e2e import _toy

pytestmark = pytest.mark.e2e

# tests.online.judges, importable by `axolotl train` run from a test's folder (before any path
# already set: a checkout tested beside another's editable install)
JUDGES_ENV = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
RECIPE = "tiny-rrhf-online-cpu.yml"


def test_a_judge_that_fails_online_names_the_prompts_file_and_row(tmp_path):
    """The judge returns None (no number) on one prompt's candidates. Four prompts are held out
    (pofe.eval.held_out: the file's last 4 rows) and row 1 repeats the last row's prompt, so it is
    left out too: the file's row 10 is prompt 9 of the prompt set, and somewhere else in the
    window. The error names the file and row 10, where it named "dataset row 9"."""
    path, recipe, rows = _toy(
        tmp_path,
        RECIPE,
        micro_batch_size=60,  # one window of every prompt, at step 0
        max_steps=1,
        pofe={
            "judge": {"type": "python", "function": "tests.online.judges:none_on_one_prompt"},
            "eval": {"held_out": 4},
        },
    )
    rows[1] = {**rows[-1]}
    prompts = recipe["datasets"][0]["path"]
    with open(prompts, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    env = {**JUDGES_ENV, "POFE_TEST_BROKEN_PROMPT": rows[10]["prompt"]}
    proc = run_axolotl("train", str(path), cwd=tmp_path, env=env, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        f"judge tests.online.judges:none_on_one_prompt returned NoneType None for dataset {prompts}, row 10 "
        "(0-based), candidate 0; expected a number (int or float)" in said
    ), said[-3000:]
