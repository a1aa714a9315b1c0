"""`make demo` as the README runs it (issue 42): a console of stage lines and one result table,
each stage's whole output in its log, the toys learning, and the README's figures the ones it
prints. One run per session (the `demo_console` fixture), read by every test here and by the
online tests (tests/online/test_online_e2e.py)."""

from __future__ import annotations

import re

import pytest

from pofe.demo.tables import BEFORE, COLUMN, LABEL, figures, result_table
from tests.helpers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("demo")]
# the demo table's first line (its header) in the README's generated block
TABLE_BLOCK = re.compile(r"<!-- demo table: begin .*?-->\n```text\n(.*?)```\n\n(.*?)\n<!-- demo table: end -->", re.S)


def test_make_demo_prints_its_stages_and_one_table_in_80_lines(demo_console):
    """Two lines a stage (as it starts; how long, what it made, its log), the table, a few
    answers: no axolotl banner or config, no library warning, no traceback."""
    assert demo_console.returncode == 0, demo_console.console[-4000:]
    lines = demo_console.console.splitlines()
    assert len(lines) <= 80, demo_console.console
    assert lines[0] == ".venv/bin/python -m pofe.demo --all"  # make's echo of the command
    stages = [line for line in lines if line.startswith("  done in ")]
    # prepare, then per offline recipe preprocess, train, evaluate; per online recipe (RRHF, SPPO,
    # Nash-MD) and the SFT recipe Nash-MD starts from, train, evaluate
    assert len(stages) == 1 + 2 * 3 + 3 * 2 + 2
    assert lines[1] == "POFE demo on the CPU, in outputs/demo (each stage's log in logs/ there)"
    assert all(re.search(r"; log logs/[\w-]+\.log$", line) for line in stages), stages
    table = result_table(demo_console.results)
    assert "\n".join(table) in demo_console.console
    for noise in ("#@@", "[WARNING]", "Traceback", "torchao", "base_model:"):
        assert noise not in demo_console.console


def test_each_stage_log_holds_the_stages_whole_output(demo_console):
    """What the console left out is in the stages' logs, each headed by its command: axolotl's
    banner and config dump, the candidate pipeline's progress (each bar's last state), the
    training's own lines; the demo process's own import-time warnings in demo.log."""
    logs = demo_console.demo / "logs"
    preprocess, train = (logs / "rrhf-preprocess.log").read_text(), (logs / "rrhf-train.log").read_text()
    assert preprocess.startswith("$ ") and preprocess.endswith("\n") and train.startswith("$ ")
    for log in (preprocess, train):
        assert "#@@" in log and '"base_model": "outputs/demo/model"' in log
    assert "pofe generate: 100%" in preprocess and "pofe judge: 100%" in preprocess
    assert "Model successfully saved to outputs/tiny-rrhf-cpu" in train
    # every refresh's figures (100 epochs, one refresh each), as the Trainer logs them; its console line
    # for one refresh in 4 and the monitor's (tests/online/test_online_e2e.py says which)
    online = (logs / "sppo-online-train.log").read_text()
    assert len(re.findall(r"\{'online/refresh': '\d+'", online)) == 100
    assert 25 <= len(re.findall(r"POFE: online refresh \d+ at step", online)) < 100


def test_the_sppo_toy_learns(demo_console):
    """recipes/tiny-sppo-cpu.yml (issue 34: Bradley-Terry preferences over a graded reward were too
    weak to learn from): the greedy reward on the training prompts goes from 0 (a random model) to
    at least 0.5. Margin: over model and prompt seeds 0, 1 and 2 it went from 0.000 to 1.000 each."""
    sppo = demo_console.run("SPPO")
    assert sppo["before"]["train"]["mean_reward"] == 0.0 and sppo["after"]["train"]["mean_reward"] >= 0.5


def readme_figures() -> tuple[dict[str, str], dict[str, tuple[float, float]]]:
    """The README's demo table as figures (`pofe.demo.tables.figures`' keys) and the ranges its
    note gives the figures that moved between CPU profiles."""
    table, note = TABLE_BLOCK.search((ROOT / "README.md").read_text()).groups()
    header, *rows = table.splitlines()
    # the columns `result_table` prints: the label, `before`, then one per run, each right-aligned
    cuts = [(LABEL, LABEL + BEFORE)] + [
        (LABEL + BEFORE + COLUMN * i, LABEL + BEFORE + COLUMN * (i + 1))
        for i in range((len(header) - LABEL - BEFORE) // COLUMN)
    ]
    titles = [header[a:b].strip() for a, b in cuts]
    shown = {}
    for row in rows:
        shown |= {
            f"{row[:LABEL].strip()} | {t}": row[a:b].strip() for t, (a, b) in zip(titles, cuts) if row[a:b].strip()
        }
    ranges = {}
    rows = [line.strip("|").split("|") for line in note.splitlines() if line.startswith("| ")]
    if rows:  # the table of the figures that moved: a row per table row, a column per run
        (_, *columns), *body = rows
        for label, *cells in body:
            ranges |= {
                f"{label.strip()} | {c.strip()}": tuple(map(float, cell.strip().split("-")))
                for c, cell in zip(columns, cells, strict=True)
                if cell.strip()
            }
    return shown, ranges


def test_the_readme_shows_the_figures_the_demo_printed(demo_console):
    """Every figure of the README's table (`python -m benchmarks.demo_figures --write`) is the one
    this run printed, to the decimals shown; one the README's note gives a range for (it moved
    between the CPU profiles that script ran) lies in that range. Times are the machine's."""
    shown, ranges = readme_figures()
    printed = figures(demo_console.results)
    assert set(shown) - {k for k in shown if k.startswith("seconds")} == set(printed)
    wrong = []
    for name, value in printed.items():
        if name in ranges:
            low, high = ranges[name]
            if not low <= float(value) <= high:
                wrong.append(f"{name}: printed {value}, README {low:.3f}-{high:.3f}")
        elif value != shown[name]:
            wrong.append(f"{name}: printed {value}, README {shown[name]}")
    assert not wrong, "\n".join(wrong)
