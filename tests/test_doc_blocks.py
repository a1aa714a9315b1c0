"""The README's and the docs' code blocks are what runs (issue 42): every shell block runs as
written here, is run as written by the test its mark names, or is marked parse only with the
reason (`tests/doc_blocks.py`), and every command in it names a real command and real options;
every YAML block validates through POFE's config and axolotl's; every JSON row through POFE's
row checks; every Python snippet runs against the real judge and pipeline code."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from pofe.recipe_modules import RECIPE_DIRS_ENV
from pofe.shipped_recipes import FOLDER
from tests.doc_blocks import DOCS, SHELL, Block, blocks
from tests.helpers import AXOLOTL_ENV, CPU, H100, ROOT, validated_recipe

BLOCKS = blocks()
SHELL_BLOCKS = [b for b in BLOCKS if b.language in SHELL]
# huggingface_hub's command-line programs, and a command of one as a doc or a message writes it
HUB_CLIS = ("hf", "huggingface-cli")
HUB_COMMAND = re.compile(r"(?:^|[\s`(\"'])((?:hf|huggingface-cli)(?: [a-z][a-z-]*)+)", re.M)
# the shell blocks that run here, each with the files its placeholders name (set up by the test)
RUN_HERE = {("README.md", "axolotl preprocess recipe.yml && axolotl train recipe.yml")}


def _ids(found: list[Block]) -> list[str]:
    return [b.where for b in found]


def _makefile_targets() -> set[str]:
    """The Makefile's targets (`a b c:` rule lines; `x := y` assignments are not rules)."""
    rules = re.findall(r"^([\w.-]+(?: [\w.-]+)*):(?!=)", (ROOT / "Makefile").read_text(), re.M)
    return {target for line in rules for target in line.split()}


def _click_command(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command an `axolotl ...` line runs, and the words after its name."""
    from axolotl.cli.main import cli

    from pofe.cli import pofe

    if words[1] == "pofe":
        assert words[2] in pofe.commands, f"`axolotl pofe {words[2]}` is not a command"
        return pofe.commands[words[2]], words[3:]
    assert words[1] in cli.commands, f"`axolotl {words[1]}` is not a command"
    return cli.commands[words[1]], words[2:]


def check_command(words: list[str]) -> None:
    """One command of a doc: its program and subcommand exist, and so does each `--option` it
    passes (up to a `--`, after which axolotl passes them on to the launcher)."""
    while words and re.fullmatch(r"\w+=\S*", words[0]):  # VAR=value before the command
        words = words[1:]
    program = words[0]
    if program == "axolotl":
        command, rest = _click_command(words)
        known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
        rest = rest[: rest.index("--")] if "--" in rest else rest
        # a synopsis writes [--a x|y] [--b]: the option names are what is checked
        given = {w.strip("[]").split("=")[0] for w in rest if w.strip("[").startswith("--")}
        assert given <= known, f"{' '.join(words)}: no option {sorted(given - known)}"
    elif words[1:3] == ["-m", "pofe.demo"]:
        from pofe.demo.__main__ import parse_args

        parse_args(words[3:])  # exits (argparse's error) on an option it does not take
    elif program.endswith("python") and words[1] == "-m":
        module = words[2]
        if module == "pytest":
            assert all((ROOT / w).exists() for w in words[3:] if not w.startswith("-")), words
        else:
            assert importlib.util.find_spec(module) is not None, f"no module {module}"
    elif program == "make":
        assert set(words[1:]) <= _makefile_targets(), f"{' '.join(words)}: no such target"
    elif program.startswith(("benchmarks/", ".ci/")):
        assert (ROOT / program).exists(), f"no script {program}"
    elif program in HUB_CLIS:  # huggingface_hub's CLI: the installed one answers its --help
        env = {**os.environ, **AXOLOTL_ENV, "NO_COLOR": "1"}
        proc = subprocess.run(
            [str(Path(sys.executable).parent / program), *words[1:], "--help"], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, f"{' '.join(words)}: {proc.stdout[-800:]}{proc.stderr[-800:]}"


def test_every_hub_cli_command_a_user_is_given_runs():
    """Each `hf` (or `huggingface-cli`) command the docs, the recipes or POFE's messages give a
    user, in a block or in prose, answers `--help` under the installed huggingface_hub (issue 49:
    `huggingface-cli login` exits 1 with huggingface_hub 1.x, "use `hf` instead")."""
    sources = [*DOCS, *sorted((ROOT / "plugin" / "pofe").rglob("*.py")), *sorted(FOLDER.glob("*.yml"))]
    sources += sorted((ROOT / "preprocess" / "pofe_candidates").rglob("*.py"))
    found = {command for path in sources for command in HUB_COMMAND.findall(path.read_text())}
    assert any(command.startswith("hf auth login") for command in found), found
    for command in sorted(found):
        check_command(command.split())


def test_every_shell_block_runs_here_or_is_marked():
    """An unmarked shell block runs here: a new one fails until this test sets up what it names
    (RUN_HERE) or a mark says why it cannot run here (parse only) or which test runs it."""
    here = {
        (str(b.doc.relative_to(ROOT)), b.text.splitlines()[0].split("  #")[0].strip())
        for b in SHELL_BLOCKS
        if b.mode == "run"
    }
    assert here == RUN_HERE
    for block in SHELL_BLOCKS:
        assert block.mode == "run" or block.why, f"{block.where}: a mark says why"


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=_ids(SHELL_BLOCKS))
def test_shell_block_parses_and_names_real_commands(block):
    """bash reads it, and each command is a real one with real options."""
    proc = subprocess.run(["bash", "-n"], input=block.text, text=True, capture_output=True)
    assert proc.returncode == 0, f"{block.where}: {proc.stderr}"
    for words in block.commands():
        check_command(words)


@pytest.mark.parametrize("block", [b for b in SHELL_BLOCKS if b.mode == "run by"], ids=lambda b: b.where)
def test_a_block_run_elsewhere_is_read_by_that_test(block):
    """The test a block's mark names reads the block (`shell_block(doc, first line)`) and runs it."""
    runner = ROOT / block.runner
    assert runner.exists(), f"{block.where}: no test {block.runner}"
    doc = str(block.doc.relative_to(ROOT))
    calls = re.findall(rf'shell_block\(\s*"{re.escape(doc)}",\s*"([^"]+)"\)', runner.read_text())
    assert any(block.text.startswith(prefix) for prefix in calls), f"{block.runner} does not run {block.where}"


# ---- YAML: every block validates through POFE's config and axolotl's ----------------------

YAML_BLOCKS = [b for b in BLOCKS if b.language == "yaml"]


def doc_recipe(block: dict, method: str) -> tuple[dict, dict]:
    """A whole recipe from a doc's YAML block, and the capabilities it is validated under. A block
    with a `base_model` is a recipe as it stands (a GPU's unless it turns bf16 off); any other is
    a fragment, laid over the tiny CPU recipe of `method`: its keys replace the recipe's, its
    `pofe:` keys the block's (a fragment of the `pofe:` block alone, `judge:` say, goes under it);
    a fragment whose datasets are rows takes the recipe's candidate blocks away with its prompts."""
    from pofe.args import PofeConfig
    from pofe.demo.__main__ import recipe_name
    from pofe.methods import method_spec

    if "base_model" in block:
        return block, (CPU if block.get("bf16") is False else H100)
    if "pofe" not in block and set(block) <= set(PofeConfig.model_fields):
        block = {"pofe": block}
    method = block.get("rl", method)  # a method that trains online only (Nash-MD) has an online tiny recipe
    name = recipe_name(method, online=method_spec(method).trains_online_only)
    recipe = yaml.safe_load((ROOT / "recipes" / f"{name}.yml").read_text())
    recipe.update({k: v for k, v in block.items() if k != "pofe"})
    if all(d.get("type") != "pofe.prompts" for d in recipe["datasets"]):  # rows: nothing to generate
        recipe["pofe"] = {k: v for k, v in recipe["pofe"].items() if k not in ("generate", "judge", "candidates")}
    recipe["pofe"] = {**recipe["pofe"], **(block.get("pofe") or {})}
    return recipe, CPU


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=_ids(YAML_BLOCKS))
def test_yaml_block_validates(block, tmp_path, monkeypatch):
    """Validated as axolotl loads a recipe (the plugin registered, POFE's block checked with it); a
    fragment that names no method validates under RRHF or SPPO (a block of SPPO's keys under RRHF
    only is refused, as it should be). Files a block names, and the recipe's base_model folder, are created
    empty where it runs."""
    monkeypatch.chdir(tmp_path)
    # the judge functions the docs' blocks name, imported as a recipe is read: one file for the process
    # (a module, once imported, stays in sys.modules; another file of its name would be refused)
    modules = tmp_path.parent / "doc-modules"
    modules.mkdir(exist_ok=True)
    _module_snippet(MY_REWARDS, modules)
    monkeypatch.setenv(RECIPE_DIRS_ENV, str(modules))
    raw = yaml.safe_load(block.text)
    errors = {}
    for method in ("rrhf", "sppo"):
        recipe, caps = doc_recipe(raw, method)
        for path in re.findall(r"\b[\w./-]+\.jsonl\b", block.text):  # prompt files a block names
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).touch()
        # the model folder, as where a user resumes a training (a resumed one's base_model is checked)
        Path(recipe["base_model"]).mkdir(parents=True, exist_ok=True)
        try:
            validated_recipe(recipe, caps)
            return
        except (ValueError, TypeError) as e:
            errors[method] = str(e)
    pytest.fail(f"{block.where}: {errors}")


# ---- JSON rows: each passes POFE's row checks as its type ---------------------------------

JSON_BLOCKS = [b for b in BLOCKS if b.language == "json" and '"messages"' not in b.text]
# axolotl's chat rows (`type: chat_template`): the supervised fine-tune a Nash-MD recipe starts from
SFT_BLOCKS = [b for b in BLOCKS if b.language == "json" and '"messages"' in b.text]


@pytest.mark.parametrize("block", JSON_BLOCKS, ids=_ids(JSON_BLOCKS))
def test_json_rows_pass_the_row_checks(block):
    """Each line a row of the type its columns say (rewards: pofe.rrhf, win_rates: pofe.sppo,
    chosen/rejected: pofe.pairs), read by `normalize_row` as the loader reads it; a block's rows
    all of one type, a file a user can copy (issue 49: an RRHF and an SPPO row in one block)."""
    from pofe.data.formats import RowFormat, normalize_row

    kinds = set()
    for index, line in enumerate(block.text.splitlines()):
        row = json.loads(line)
        kind, method = ("pofe.sppo", "sppo") if "win_rates" in row else ("pofe.rrhf", "rrhf")
        if "chosen" in row:
            kind = "pofe.pairs"
        normalize_row(row, index, RowFormat(dataset=block.where, type=kind, method=method, fields={}))
        kinds.add(kind)
    assert len(kinds) == 1, f"{block.where}: rows of {sorted(kinds)} in one block"


def test_sft_rows_train_on_the_assistant_turn_as_the_sft_recipe_reads_them():
    """Issue 49: the SFT rows' format was only a recipe comment, without roles. Each row, tokenised
    by axolotl's `chat_template` strategy with recipes/tiny-sft-cpu.yml's dataset entry and the toy's
    tokenizer, trains on exactly its assistant turns, each ended by the end-of-turn token; the rows
    are the demo's (`pofe.demo.task.sft_rows` of the same prompt and answer)."""
    from axolotl.prompt_strategies.chat_template import load
    from axolotl.utils.dict import DictDefault

    from pofe.demo.task import sft_rows
    from pofe.demo.tiny import EOS, build_tokenizer

    assert [str(b.doc.relative_to(ROOT)) for b in SFT_BLOCKS] == ["docs/data-formats.md"]
    recipe = DictDefault(yaml.safe_load((FOLDER / "tiny-sft-cpu.yml").read_text()))
    tokenizer = build_tokenizer()
    strategy = load(tokenizer, recipe, recipe.datasets[0])
    for line in (line for block in SFT_BLOCKS for line in block.text.splitlines()):
        row = json.loads(line)
        turns = row["messages"]
        tokens = strategy.tokenize_prompt(row)
        trained = [i for i, label in zip(tokens["input_ids"], tokens["labels"], strict=True) if label != -100]
        assert tokenizer.decode(trained) == "".join(t["content"] + EOS for t in turns if t["role"] == "assistant")
        assert [row] == sft_rows([{"prompt": turns[0]["content"], "answer": turns[1]["content"]}])


# ---- Python snippets: run against the real judge and pipeline code ------------------------

PYTHON_BLOCKS = {(str(b.doc.relative_to(ROOT)), b.text.splitlines()[0]): b for b in BLOCKS if b.language == "python"}
MY_REWARDS = ("docs/candidates.md", "# my_rewards.py")
LIBRARY = (
    "preprocess/README.md",
    "from pofe_candidates import GenerateConfig, JudgeConfig, CandidatesConfig, run_pipeline",
)


def _block_before(block: Block, language: str) -> Block:
    """The block of `language` just above `block` in its doc."""
    return [b for b in BLOCKS if b.doc == block.doc and b.line < block.line and b.language == language][-1]


def _module_snippet(key: tuple[str, str], folder: Path) -> Block:
    """A snippet headed `# <module>.py`, written to `folder` as that module."""
    block = PYTHON_BLOCKS[key]
    name = re.match(r"# (\w+\.py)\n", block.text)[1]
    (folder / name).write_text(block.text)
    return block


def test_every_python_snippet_is_run_below():
    assert set(PYTHON_BLOCKS) == {MY_REWARDS, LIBRARY}


@pytest.mark.usefixtures("one_torch_thread")
def test_the_reward_funcs_snippet_judges_candidates_as_the_yaml_above_it_says(tmp_path, monkeypatch, tiny_model):
    """docs/candidates.md's `my_rewards.py` with the `reward_funcs` block above it, through the
    candidate pipeline (the transformers backend on the tiny model, the dataset's answer added
    as a candidate): each candidate's reward is 1.0 * correct_answer + 0.2 * format_ok, the
    functions called as TRL calls them, the `answer` column passed as a keyword."""
    from pofe_candidates import CandidatesConfig, GenerateConfig, JudgeConfig, run_pipeline

    block = _module_snippet(MY_REWARDS, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    judge = yaml.safe_load(_block_before(block, "yaml").text)["pofe"]["judge"]
    rows = [{"prompt": "12+7=", "answer": "19"}, {"prompt": "3+4=", "answer": "7"}]
    gen = GenerateConfig(
        backend="transformers", num_candidates=3, max_new_tokens=4, include_dataset_responses=["answer"]
    )
    result = run_pipeline(
        rows,
        policy_path=str(tiny_model),
        method="rrhf",
        generate=gen,
        judge=JudgeConfig(**judge),
        candidates=CandidatesConfig(out_dir=str(tmp_path / "out"), progress=False),
    )
    import my_rewards

    built = [json.loads(line) for line in Path(result.data_path).read_text().splitlines()]
    for row, source in zip(built, rows, strict=True):
        texts = row["responses"]
        correct = my_rewards.correct_answer(
            [row["prompt"]] * len(texts), texts, answer=[source["answer"]] * len(texts)
        )
        fmt = my_rewards.format_ok([row["prompt"]] * len(texts), texts)
        assert row["rewards"] == pytest.approx([1.0 * c + 0.2 * f for c, f in zip(correct, fmt, strict=True)])
        assert source["answer"] in texts and row["rewards"][texts.index(source["answer"])] == pytest.approx(1.2)


@pytest.mark.usefixtures("one_torch_thread")
def test_the_library_snippet_builds_candidates(tmp_path, monkeypatch, tiny_model):
    """preprocess/README.md's run_pipeline example, as written but for its placeholder policy
    path (the tiny model in its place): it prints the rows' file and the best-of-k reward, 1.0
    (each row's human answer is a candidate and the judge's verdict on it is 1)."""
    block = PYTHON_BLOCKS[LIBRARY]
    assert block.text.count('"path/to/policy"') == 1
    monkeypatch.chdir(tmp_path)
    printed = []
    code = block.text.replace('"path/to/policy"', repr(str(tiny_model)))
    exec(compile(code, block.where, "exec"), {"print": lambda *a: printed.append(a)})
    ((data_path, best_of_k),) = printed
    assert Path(data_path).exists() and best_of_k == 1.0


# ---- shell blocks run here ----------------------------------------------------------------


def _axolotl_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **AXOLOTL_ENV, **extra}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.e2e
def test_your_own_data_runs_as_the_readme_writes_it(tmp_path, tiny_model):
    """The README's "Your own data": its JSON row in data/candidates.jsonl, its five YAML lines in a
    tiny CPU recipe (one epoch), and its command as written, `axolotl preprocess` then `axolotl
    train` (accelerate, axolotl's default launcher): the model is trained and saved."""
    section = [b for b in BLOCKS if b.doc.name == "README.md" and b.line > _readme_line("## Your own data")]
    row, fragment, command = (next(b for b in section if b.language == lang) for lang in ("json", "yaml", "bash"))
    assert (str(command.doc.relative_to(ROOT)), command.text.strip()) in RUN_HERE
    recipe, _ = doc_recipe(yaml.safe_load(fragment.text), "rrhf")
    recipe.update(base_model=str(tiny_model), output_dir="out", dataset_prepared_path="prepared", num_epochs=1)
    (tmp_path / "data").mkdir()
    (tmp_path / recipe["datasets"][0]["path"]).write_text(row.text)
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    proc = subprocess.run(
        ["bash", "-e", "-c", command.text],
        cwd=tmp_path,
        env=_axolotl_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "out" / "model.safetensors").exists()


def _readme_line(heading: str) -> int:
    return (ROOT / "README.md").read_text().splitlines().index(heading) + 1


# ---- what the docs claim of a judge module of your own (issue 44 fixes both) ----------------


def _reward_funcs_recipe(folder: Path, tiny_model: Path) -> Path:
    """docs/candidates.md's reward functions (`my_rewards.py` written to `folder`) judging the tiny
    RRHF recipe's prompts, with their `answer` column; the last 4 prompts held out."""
    from pofe.demo.task import make_prompt_rows, write_jsonl

    _module_snippet(MY_REWARDS, folder)
    judge = yaml.safe_load(_block_before(PYTHON_BLOCKS[MY_REWARDS], "yaml").text)["pofe"]["judge"]
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny-rrhf-cpu.yml").read_text())
    recipe.update(base_model=str(tiny_model), output_dir="out", dataset_prepared_path="prepared", num_epochs=1)
    recipe["datasets"][0]["path"] = str(write_jsonl(make_prompt_rows(8, seed=0), folder / "prompts.jsonl"))
    recipe["pofe"]["judge"] = judge
    recipe["pofe"]["eval"] = {"held_out": 4, "num_samples": 1, "temperature": 0.0, "max_new_tokens": 4}
    (folder / "recipe.yml").write_text(yaml.safe_dump(recipe))
    return folder / "recipe.yml"


@pytest.mark.e2e
def test_a_judge_module_in_the_working_directory_imports(tmp_path, tiny_model):
    """docs/candidates.md's my_rewards.py in the directory `axolotl preprocess` runs from, no PYTHONPATH."""
    recipe = _reward_funcs_recipe(tmp_path, tiny_model)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "axolotl"), "preprocess", recipe.name],
        cwd=tmp_path,
        env=_axolotl_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.e2e
def test_the_docs_reward_functions_judge_the_held_out_evaluation(tmp_path, tiny_model):
    """`axolotl pofe eval --model` (the tiny model against itself: the evaluation, not a training,
    is what is tested) on the held-out prompts, judged by docs/candidates.md's reward functions."""
    recipe = _reward_funcs_recipe(tmp_path, tiny_model)
    # a copy: the evaluation goes into the model's folder (pofe-eval/), and the session's tiny model is shared
    model = shutil.copytree(tiny_model, tmp_path / "trained")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "axolotl"), "pofe", "eval", recipe.name, "--model", str(model)],
        cwd=tmp_path,
        env=_axolotl_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
