"""The run's state file (`pofe.run.folder.RunState`): stages recorded, another recipe's or another
version's refused."""

from __future__ import annotations

import json

import pytest

from pofe.run.folder import RunState, RunStateMismatch


def test_state_file_records_stages_and_refuses_another_recipe(tmp_path):
    path = tmp_path / "pofe-run.json"
    st = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    st.start("round-1/train")
    # killed here: a restart sees the stage as unfinished
    st = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    assert not st.done("round-1/train")
    st.start("round-1/train")
    st.finish("round-1/train", output_dir="o")
    again = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    assert again.done("round-1/train") and again.stages["round-1/train"]["output_dir"] == "o"
    assert len(again.starts) == 3
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temporary files
    with pytest.raises(RunStateMismatch, match="different recipe"):
        RunState.open(path, fingerprint="b", recipe="r.yml", method="rrhf")


def test_a_state_file_of_another_version_is_refused_naming_both(tmp_path):
    """Version 1 state files keyed their prompt files and caches by other hashes: a restart
    under this POFE would re-check them wrongly, so it stops and says what to do."""
    path = tmp_path / "pofe-run.json"
    RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    old = {**json.loads(path.read_text()), "version": 1}
    path.write_text(json.dumps(old))
    with pytest.raises(RunStateMismatch, match=r"run state is version 1; this one reads version 2 .* new output_dir"):
        RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")


def test_a_cut_state_file_is_named_with_where_it_stops_and_what_to_do(tmp_path):
    """Weak case 12 of issue 33: pofe-run.json cut short (a full disk) ended the run with the
    decoder's words alone. Now the error names the file, where its JSON stops, that it is the
    run's record, and the three ways on; moved aside, the run starts again with no stage done
    (each stage then redone, reusing what it checks as this recipe's)."""
    path = tmp_path / "pofe-run.json"
    state = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    state.start("round-1/train", output_dir="o")
    text = path.read_text()
    path.write_text(text[: text.index('"output_dir"') + 5])
    with pytest.raises(RunStateMismatch) as e:
        RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    assert str(e.value) == (
        f"{path} is not valid JSON (Unterminated string starting at: line 16, column 7): cut short or edited. "
        "It is the run's record of which stages are done: restore it from a backup and run again to go on "
        f"where the run stopped; or move it aside (mv {path} {path}.broken) and run again, which redoes every "
        "stage, reusing the candidates' shards and the training checkpoints this recipe wrote (a finished "
        "round may train again); or start afresh with a new output_dir."
    )
    path.rename(tmp_path / "pofe-run.json.broken")
    again = RunState.open(path, fingerprint="a", recipe="r.yml", method="rrhf")
    assert again.stages == {} and len(again.starts) == 1
