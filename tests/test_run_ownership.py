"""An iterated run writes only into an output_dir it owns (bad case 9 of issue 20): a folder
of other files is refused unless `pofe.overwrite_output_dir`, and then the files found there
are never deleted as POFE's stale outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pofe.run.folder import RunFolder, RunState
from pofe.run.guards import PREEXISTING_NAME, OutputDirRefused, claim_output_dir, pofe_wrote
from pofe.run.report import write_report

RECIPE = Path(__file__).parents[1] / "recipes" / "tiny-rrhf-cpu.yml"


def _foreign(root: Path) -> dict[str, str]:
    files = {
        "eval/eval.json": '{"mine": 1}',
        "report.md": "my notes",
        "report-old.png": "png",
        "prompts/round-1.jsonl": "{}",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return files


def test_a_folder_of_other_files_is_refused_and_left_as_it_was(tmp_path):
    files = _foreign(tmp_path)
    with pytest.raises(
        OutputDirRefused,
        match=r"holds 4 files but no POFE run \(eval, prompts, report-old.png, "
        r"report.md\).*pofe.overwrite_output_dir: true",
    ):
        claim_output_dir(RunFolder(tmp_path), overwrite=False, echo=print)
    assert {str(p.relative_to(tmp_path)): p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == files


def test_a_file_as_output_dir_is_named(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(OutputDirRefused, match=rf"output_dir {tmp_path / 'out'} is a file, not a folder"):
        claim_output_dir(RunFolder(tmp_path / "out"), overwrite=False, echo=print)


@pytest.mark.parametrize("marker", ["pofe-run.json", "pofe-run.lock", "debug.log", None])
def test_a_new_folder_or_a_pofe_run_is_taken_as_it_is(tmp_path, marker):
    """A missing folder, one holding only axolotl's debug.log (which every load of a recipe
    writes there), or a run's (its state; or its lock alone: a run killed before its state
    was written) needs no key and records nothing."""
    root = tmp_path / "run"
    if marker == "debug.log":
        root.mkdir()
        (root / marker).write_text("log")
    elif marker:
        _foreign(root)
        (root / marker).write_text("{}")
    claim_output_dir(RunFolder(root), overwrite=False, echo=print)
    assert not (root / PREEXISTING_NAME).exists()


def test_overwrite_records_what_was_there_and_the_report_keeps_it(tmp_path):
    """With the key, the files found are recorded; the report's clean-up of old plots then
    removes POFE's own (report-rewards.png, written after the start) and keeps the one that
    was there (report-old.png). Without the record both went."""
    _foreign(tmp_path)
    said = []
    folder = RunFolder(tmp_path)
    claim_output_dir(folder, overwrite=True, echo=said.append)
    assert "holds 4 files of no POFE run" in said[0]
    recorded = json.loads((tmp_path / PREEXISTING_NAME).read_text())["files"]
    assert sorted(recorded) == ["eval/eval.json", "prompts/round-1.jsonl", "report-old.png", "report.md"]
    assert recorded["report.md"] == [len("my notes"), (tmp_path / "report.md").stat().st_mtime_ns]
    (tmp_path / "report-rewards.png").write_text("an earlier report's plot")
    assert not pofe_wrote(folder, tmp_path / "eval" / "eval.json") and pofe_wrote(
        folder, tmp_path / "report-rewards.png"
    )

    RunState(folder.state, "r.yml", "f", "sppo", starts=[1.0], rounds_planned=1).save()
    report = write_report(folder)
    assert (tmp_path / "report-old.png").read_text() == "png"
    assert not (tmp_path / "report-rewards.png").exists()
    assert report.data["eval"] is None  # the eval/eval.json found there is not read as the run's
    assert pofe_wrote(folder, tmp_path / "report.md")  # rewritten by the report: POFE's now
    claim_output_dir(folder, overwrite=False, echo=said.append)  # a run now: no key needed to resume


def test_pofe_run_refuses_the_folder_before_writing_anything(tiny_model, tmp_path):
    """`axolotl pofe run`'s entry point, on the README's CPU recipe pointed at a tiny model:
    refused before its lock, state or prompts are written."""
    from pofe.run.rounds.loop import run_rounds

    out = tmp_path / "out"
    out.mkdir()
    files = _foreign(out)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "near_misses": []}) + "\n" for i in range(4))
    )
    raw = yaml.safe_load(RECIPE.read_text())
    raw.update(base_model=str(tiny_model), output_dir=str(out), dataset_prepared_path=str(tmp_path / "prepared"))
    raw["datasets"][0]["path"] = str(prompts)
    recipe = tmp_path / "recipe.yml"
    recipe.write_text(yaml.safe_dump(raw))
    with pytest.raises(OutputDirRefused, match="no POFE run"):
        run_rounds(recipe, echo=print)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(files)
