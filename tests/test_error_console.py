"""What a user's console ends with (issue 42): a POFE error in `axolotl preprocess` or `axolotl
train` ends it with POFE's message alone (the traceback in axolotl's own log of the run, or on the
console with `--debug`), and `--json` output is alone on stdout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import AXOLOTL_ENV, ROOT, pofe_block, prompts_file, recipe, run_axolotl

pytestmark = pytest.mark.e2e
BAD_ROW = (
    "dataset data.jsonl, row 2 (0-based), field 'rewards[1]': expected a number, got None. Fix or remove this row."
)


@pytest.fixture
def bad_row_recipe(tmp_path, tiny_model) -> Path:
    """An RRHF recipe whose third row has `null` for a reward."""
    rows = [{"prompt": f"1+{i}=", "responses": [str(i + 1), "0"], "rewards": [1.0, 0.2]} for i in range(3)]
    rows[2]["rewards"][1] = None
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = recipe(tmp_path, tiny_model, "rrhf", Path("data.jsonl"), "pofe.rrhf", output_dir="out")
    return path


def _ending(proc) -> list[str]:
    return proc.stderr.strip().splitlines()[-2:]


def test_a_bad_row_ends_axolotl_preprocess_with_pofes_message(bad_row_recipe, tmp_path):
    """The message, then where the traceback is: axolotl's own log of the run (it tees the console
    to output_dir/debug.log), which holds it; `--debug` prints the traceback instead."""
    proc = run_axolotl("preprocess", "recipe.yml", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert _ending(proc) == [f"Error: {BAD_ROW}", "(the traceback: out/debug.log; `--debug` prints it here)"]
    assert "Traceback" not in proc.stdout + proc.stderr
    log = (tmp_path / "out" / "debug.log").read_text()
    assert "Traceback (most recent call last):" in log and f"PofeDataError: {BAD_ROW}" in log

    debug = run_axolotl("preprocess", "recipe.yml", "--debug", cwd=tmp_path, check=False)
    assert debug.returncode == 1
    assert "Traceback (most recent call last):" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == f"pofe.data.formats.PofeDataError: {BAD_ROW}"


def test_a_bad_row_ends_axolotl_train_with_pofes_message(bad_row_recipe, tmp_path):
    """`axolotl train` under accelerate (axolotl's default launcher): the trainer's process ends
    with POFE's message; accelerate adds its own traceback of the launch unless told `--quiet`
    (its option, after `--`), which is how this checks the ending."""
    env = {**os.environ, **AXOLOTL_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    cmd = [str(Path(sys.executable).parent / "axolotl"), "train", "recipe.yml", "--", "--quiet"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert _ending(proc) == [f"Error: {BAD_ROW}", "(the traceback: out/debug.log; `--debug` prints it here)"]
    assert "Traceback" not in proc.stdout + proc.stderr


MISSPELLED_JUDGE = (
    "Error: judge.function 'mymodul:reward': cannot import module 'mymodul': no module 'mymodul' in the recipe's "
    "folder or the working directory ({folders}), nor installed. Did you mean 'mymodule' (mymodule.py)?"
)


@pytest.fixture
def misspelled_judge(tmp_path, tiny_model) -> tuple[Path, str]:
    """A recipe from prompts in recipes/, its judge `mymodul:reward` where the file beside it is
    mymodule.py; run from tmp_path. Returns the recipe and the message's first line."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "mymodule.py").write_text("def reward(prompt, response):\n    return 1.0\n")
    data, _ = prompts_file(tmp_path)
    pofe = pofe_block("rrhf")
    pofe["judge"]["function"] = "mymodul:reward"
    path = recipe(tmp_path, tiny_model, "rrhf", data, "pofe.prompts", output_dir="out", pofe=pofe)
    path = path.rename(folder / "recipe.yml")
    return path, MISSPELLED_JUDGE.format(folders=f"{folder}, {tmp_path}")


@pytest.mark.parametrize("command", ["preprocess", "train"])
def test_a_misspelled_judge_module_ends_the_console_with_pofes_message(misspelled_judge, tmp_path, command):
    """Issue 49: `judge.function: mymodul:reward` printed a 90-line traceback above the message;
    now the message alone ends the console, naming the folders looked in and the file meant."""
    path, message = misspelled_judge
    proc = run_axolotl(command, "recipes/recipe.yml", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    # refused as the recipe is read (issue 50), before axolotl tees the console to output_dir/debug.log
    said, where = _ending(proc)
    assert said == message and re.fullmatch(
        r"\(the traceback: .+/pofe-error-\w+\.log; `--debug` prints it here\)", where
    )
    assert "Traceback" not in proc.stdout + proc.stderr


def test_plan_refuses_a_judge_that_cannot_import(misspelled_judge, tmp_path):
    """Issue 49: `axolotl pofe plan` planned a run whose judge cannot import, and exited 0; now it
    imports the judge as the judge stage does, and ends with POFE's message."""
    path, message = misspelled_judge
    proc = run_axolotl("pofe", "plan", "recipes/recipe.yml", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in proc.stdout + proc.stderr


def test_plan_json_is_alone_on_stdout(tmp_path, tiny_model):
    """`python -m pofe.cli plan --json`, a real process: stdout parses as JSON (the libraries'
    lines went to stderr), with PYTHONUNBUFFERED set or not. Under `axolotl pofe` the JSON follows
    axolotl's banner and nothing else: its CLI prints and flushes the banner before it imports a
    plugin's command (docs/iterated.md says so)."""
    from axolotl.cli.art import AXOLOTL_LOGO

    raw = yaml.safe_load((ROOT / "recipes" / "tiny-sppo-cpu.yml").read_text())
    raw.update(base_model=str(tiny_model), output_dir=str(tmp_path / "out"))
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(raw))
    env = {**os.environ, **AXOLOTL_ENV, "PYTHONUNBUFFERED": "1"}
    alone = subprocess.run(
        [sys.executable, "-m", "pofe.cli", "plan", "recipe.yml", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    plan = json.loads(alone.stdout)
    assert plan["method"] == "sppo" and [s["stage"] for s in plan["stages"]][:2] == ["generate", "judge"]
    under_axolotl = run_axolotl("pofe", "plan", "recipe.yml", "--json", cwd=tmp_path)
    assert under_axolotl.stdout.startswith(AXOLOTL_LOGO + "\n")
    again = json.loads(under_axolotl.stdout.removeprefix(AXOLOTL_LOGO + "\n"))
    assert {k: v for k, v in again.items() if k != "free_disk_gb"} == {
        k: v for k, v in plan.items() if k != "free_disk_gb"
    }


# a judge module beside the recipe that cannot judge: its file, the line, what Python said of it
BROKEN_JUDGES = {
    "syntax error": (
        "import math\n\ndef reward(prompt, response)\n    return 1.0\n",
        "Error: judge.function 'myjudge:reward': module 'myjudge' fails as it imports, at {file}, line 3: "
        "SyntaxError: expected ':'. Fix the module there (`python -c 'import myjudge'` in the recipe's folder "
        "shows the same)",
    ),
    "not a function": (
        "import math\n\nreward = math.pi / 4\n",
        "Error: judge.function 'myjudge:reward': myjudge.reward ({file}, line 3) is float 0.7853981633974483, not "
        "a function: point the recipe at the function that judges, or define it there",
    ),
}


@pytest.mark.parametrize(
    ("command", "case"),
    # every command with each case would run 6 processes for one check: train both, the others one each
    [
        ("train", "syntax error"),
        ("train", "not a function"),
        ("preprocess", "syntax error"),
        ("pofe plan", "not a function"),
    ],
)
def test_a_judge_module_that_cannot_judge_is_refused_as_the_recipe_is_read(tmp_path, tiny_model, command, case):
    """Issue 50: an online recipe whose judge module has a syntax error, or whose judge is a number, was
    found at the first refresh, after the model had loaded (a SyntaxError's traceback, or "is not
    callable"). Now every command that reads the recipe imports the judge first and ends with the file,
    the line and what to do; nothing loads the model."""
    source, message = BROKEN_JUDGES[case]
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "myjudge.py").write_text(source)
    data, _ = prompts_file(tmp_path)
    pofe = {**pofe_block("rrhf"), "online": {"refresh_every": 1}}
    pofe["judge"]["function"] = "myjudge:reward"
    path = recipe(tmp_path, tiny_model, "rrhf", data, "pofe.prompts", output_dir="out", pofe=pofe)
    path.rename(folder / "recipe.yml")
    proc = run_axolotl(*command.split(), "recipes/recipe.yml", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    ending = [line for line in proc.stderr.strip().splitlines() if line.startswith("Error: ")]
    assert ending == [message.format(file=folder / "myjudge.py")]
    assert "Traceback" not in proc.stdout + proc.stderr and "Loading weights" not in proc.stdout + proc.stderr


def test_an_error_file_that_cannot_be_written_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    """`record_error` where the runner's error file cannot take the message (here a folder stands
    at its path; on a full disk the write fails alike): nothing is left beside it, and stderr says
    which file and why."""
    from pofe.errors import ERROR_FILE_ENV, PofeError, record_error

    target = tmp_path / "error.txt"
    target.mkdir()
    monkeypatch.setenv(ERROR_FILE_ENV, str(target))
    record_error(PofeError("the recipe names no judge"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error.txt"]
    err = capsys.readouterr().err
    assert err.startswith(f"POFE: could not write this error's message to {target} for `axolotl pofe run`: ")
    assert "Is a directory" in err
