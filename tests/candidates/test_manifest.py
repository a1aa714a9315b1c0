"""What a candidates folder's shards were built from (`pofe_candidates.manifest`): a cut manifest."""

from __future__ import annotations

import json

import pytest

from pofe.files import UnreadableFile
from pofe_candidates.manifest import check_manifest


def test_a_cut_manifest_is_named_with_what_to_do(tmp_path):
    """Issue 33 (case 12, the runner's other JSON files): generate/manifest.json cut short failed
    the preprocess stage with a bare JSONDecodeError. Now the error names the file, where its
    JSON stops and the folder to delete; the shards are not reused unchecked."""
    stage = tmp_path / "generate"
    stage.mkdir()
    manifest = {"method": "rrhf", "generate": {"seed": 7, "num_candidates": 4}}
    check_manifest(stage, manifest)  # written: the first run
    (stage / "shard-00000.jsonl").write_text('{"row_id": 0}\n')
    check_manifest(stage, manifest)  # the same: the shards are this recipe's
    text = (stage / "manifest.json").read_text()
    (stage / "manifest.json").write_text(text[: text.index('"seed"')])
    with pytest.raises(UnreadableFile) as e:
        check_manifest(stage, manifest)
    assert str(e.value) == (
        f"{stage / 'manifest.json'} is not valid JSON (Expecting property name enclosed in double quotes: "
        f"line 4, column 5): cut short or edited. It records the settings the shards of {stage} were built "
        f"with, which cannot be checked without it: delete {stage} to build them again."
    )
    assert json.loads((stage / "shard-00000.jsonl").read_text()) == {"row_id": 0}
