"""`python -m pofe.demo`: its options, and what a failed stage leaves on the console."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.helpers import AXOLOTL_ENV, ROOT


def _demo(cwd, *args, timeout=900, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, **AXOLOTL_ENV, **(env or {})}
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        [sys.executable, "-m", "pofe.demo", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_help_describes_every_option():
    from pofe.demo.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    proc = _demo(ROOT, "--help", timeout=120)
    assert proc.returncode == 0
    for option in (
        "--method {rrhf,sppo,nash_md}",
        "--all",
        "--recipe RECIPE",
        "--seed SEED",
        "--prepare-only",
        "--debug",
    ):
        assert option in proc.stdout
    # each option has its own help line, not argparse's bare name
    assert (
        "rrhf (default; with --real, every method unless one is named): rank the candidates by their reward"
        in " ".join(proc.stdout.split())
    )
    assert "Write the tiny model and the prompts where the recipe expects them" in " ".join(proc.stdout.split())


def test_the_recipes_make_demo_runs():
    """`--all`: each method offline, then each online (Nash-MD online only, after the SFT recipe
    whose model is its pi_0); one recipe otherwise."""
    from pofe.demo.__main__ import parse_args, recipes

    names = [p.name for p in recipes(parse_args(["--all"]))]
    assert names == [
        "tiny-rrhf-cpu.yml",
        "tiny-sppo-cpu.yml",
        "tiny-rrhf-online-cpu.yml",
        "tiny-sppo-online-cpu.yml",
        "tiny-sft-cpu.yml",
        "tiny-nash-md-online-cpu.yml",
    ]
    assert [p.name for p in recipes(parse_args(["--method", "sppo", "--online"]))] == ["tiny-sppo-online-cpu.yml"]
    nash_md = ["tiny-sft-cpu.yml", "tiny-nash-md-online-cpu.yml"]
    assert [p.name for p in recipes(parse_args(["--method", "nash_md", "--online"]))] == nash_md


def test_prepare_only_says_one_line(tmp_path):
    """The training stack's import-time warnings (torchao's, bitsandbytes') go to the demo's log;
    from a folder without recipes/ (the demo reads its packaged recipes). Each file written named."""
    proc = _demo(tmp_path, "--prepare-only", "--prompts", "12", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).splitlines() == [
        "wrote a tiny model to outputs/demo/model, 12 prompts to outputs/demo/prompts.jsonl"
    ]
    assert len((tmp_path / "outputs" / "demo" / "prompts.jsonl").read_text().splitlines()) == 12
    # the toy's rows of the first run are the demo's to write again
    proc = _demo(tmp_path, "--prepare-only", "--prompts", "5", "--seed", "1", timeout=300)
    assert proc.stdout.splitlines() == [
        "wrote a tiny model to outputs/demo/model, 5 prompts to outputs/demo/prompts.jsonl"
    ]
    assert len((tmp_path / "outputs" / "demo" / "prompts.jsonl").read_text().splitlines()) == 5


USERS_ROWS = b'{"prompt": "my own prompt", "answer": "mine"}\n'
USERS_MODEL = b'{"model_type": "llama", "vocab_size": 49152}\n'


def _own_recipe(folder, model: bool = False) -> dict:
    """recipes/mine.yml in `folder`: the tiny RRHF recipe whose dataset holds the user's rows (and,
    with `model`, whose base_model folder holds a model of theirs)."""
    shutil.copytree(ROOT / "recipes", folder / "recipes")
    recipe = yaml.safe_load((folder / "recipes" / "tiny-rrhf-cpu.yml").read_text())
    (folder / recipe["datasets"][0]["path"]).parent.mkdir(parents=True)
    (folder / recipe["datasets"][0]["path"]).write_bytes(USERS_ROWS)
    if model:
        recipe["base_model"] = "my-model"
        (folder / "my-model").mkdir()
        (folder / "my-model" / "config.json").write_bytes(USERS_MODEL)
    (folder / "recipes" / "mine.yml").write_text(yaml.safe_dump(recipe))
    return recipe


def test_prepare_only_keeps_the_data_file_of_a_recipe_of_ones_own(tmp_path):
    """`--recipe mine.yml --prepare-only` (issue 49): the recipe's dataset holds the user's prompts,
    which stay byte for byte as they were, and the console says so; the tiny model is written."""
    recipe = _own_recipe(tmp_path)
    proc = _demo(tmp_path, "--recipe", "recipes/mine.yml", "--prepare-only", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / recipe["datasets"][0]["path"]).read_bytes() == USERS_ROWS
    assert (proc.stdout + proc.stderr).splitlines() == [
        f"wrote a tiny model to {recipe['base_model']}",
        f"kept {recipe['datasets'][0]['path']} as it is: it holds rows other than the toy's (remove it for the toy's)",
    ]
    assert (tmp_path / recipe["base_model"] / "config.json").exists()


def test_the_demo_writes_over_no_model_or_rows_of_the_users(tmp_path):
    """A recipe whose base_model folder holds a model of the user's and whose dataset their rows:
    `--prepare-only` keeps both and says so; the demo's run, which would write the toy's over both,
    stops first, naming them. The toy's own model and rows (an earlier run's) are the demo's."""
    from pofe.demo.stages import prepare, users_files

    recipe = _own_recipe(tmp_path, model=True)
    proc = _demo(tmp_path, "--recipe", "recipes/mine.yml", "--prepare-only", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "kept my-model as it is: it holds a model other than the toy's (remove it for the toy's)",
        f"kept {recipe['datasets'][0]['path']} as it is: it holds rows other than the toy's (remove it for the toy's)",
    ]
    proc = _demo(tmp_path, "--recipe", "recipes/mine.yml", timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "Error: my-model holds a model other than the toy's; "
        f"{recipe['datasets'][0]['path']} holds rows other than the toy's, where the demo writes the toy's"
    )
    assert (tmp_path / "my-model" / "config.json").read_bytes() == USERS_MODEL
    assert [p.name for p in (tmp_path / "my-model").iterdir()] == ["config.json"]
    assert (tmp_path / recipe["datasets"][0]["path"]).read_bytes() == USERS_ROWS
    sft = yaml.safe_load((ROOT / "recipes" / "tiny-sft-cpu.yml").read_text())
    sft["base_model"] = str(tmp_path / "model")
    sft["datasets"][0]["path"] = str(tmp_path / "sft.jsonl")
    prepare(sft, seed=1, prompts=3)
    assert users_files(sft) == {}


def test_a_method_that_trains_online_only_asks_for_online():
    from pofe.demo.__main__ import main

    with pytest.raises(SystemExit, match="--method nash_md trains online only: add --online"):
        main(["--method", "nash_md"])


@pytest.mark.e2e
def test_a_failed_stage_ends_the_console_with_its_error_and_log(tmp_path):
    """A POFE error in the preprocess stage (a judge with no verdict, judge.allow_abstain: false):
    the console ends with POFE's message and the stage's log, no traceback; the log has it."""
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    (tmp_path / "no_verdict.py").write_text("def reward(prompt, response):\n    return float('nan')\n")
    recipe = yaml.safe_load((tmp_path / "recipes" / "tiny-rrhf-cpu.yml").read_text())
    recipe["pofe"]["judge"] = {"type": "python", "function": "no_verdict:reward", "allow_abstain": False}
    (tmp_path / "recipes" / "no-verdict.yml").write_text(yaml.safe_dump(recipe))
    proc = _demo(tmp_path, "--recipe", "recipes/no-verdict.yml", env={"PYTHONPATH": str(tmp_path)})
    log = tmp_path / "outputs" / "demo" / "logs" / "rrhf-preprocess.log"
    assert proc.returncode == 1
    errors = proc.stderr.strip().splitlines()
    assert errors[0].startswith("Error: rrhf/preprocess failed: judge gave no verdict for dataset row ")
    assert errors[-1] == f"(the stage's whole output, traceback included: {log.relative_to(tmp_path)})"
    assert proc.stdout.splitlines()[-1] == "RRHF: axolotl preprocess recipes/no-verdict.yml"
    assert proc.stdout.splitlines()[0] == "POFE demo on the CPU, in outputs/demo (each stage's log in logs/ there)"
    assert "Traceback" not in proc.stdout + proc.stderr and "Traceback" in log.read_text()
