"""The length policy's cuts (`pofe.length_policy`) and the per-row record the loader writes."""

from __future__ import annotations

import json

import pytest
import yaml
from axolotl.cli.config import prepare_plugins
from axolotl.utils.config import normalize_config, validate_config
from axolotl.utils.dict import DictDefault

from pofe.args import pofe_config
from pofe.length_policy import cut_collision, cut_response, fit_turns
from pofe.run.folder import RoundRecord, RunFolder, RunState
from pofe.run.report.collect import collect
from pofe.run.report.markdown import render_markdown
from tests.helpers import recipe, validated_recipe

CPU = {"bf16": False, "fp8": False, "tf32": False, "n_gpu": 0, "compute_capability": None}


def test_fit_turns_keeps_system_and_starts_at_a_user_turn():
    """Each message counts its content's length here; the prompt may hold 7. Cutting u1 alone would
    start at an assistant turn, so u1 and a1 go together; a last turn over the limit drops the row."""
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2u2u2"},
    ]
    length = lambda m: sum(len(x["content"]) for x in m)  # noqa: E731
    assert fit_turns(msgs, length, 7) == ([msgs[0], msgs[3]], 2)
    assert fit_turns(msgs, length, 6) == (None, 0)


def test_cut_response_removes_a_partial_end_of_turn():
    """Content [1, 2, 3], end of turn [8, 9]: room 4 would keep [1, 2, 3, 8], a response whose
    end token passes for finished; the cut keeps the content only."""
    assert cut_response([1, 2, 3, 8, 9], [8, 9], 4) == [1, 2, 3]
    assert cut_response([1, 2, 3, 8, 9], [8, 9], 2) == [1, 2]
    # identical before the cut: not a collision made by it
    assert cut_collision([[1, 2], [1, 2]], [[1], [1]], [[1.0, 0.0]]) is None


def test_prepared_rows_record_the_length_policy_per_row(tmp_path, tiny_model, caplog):
    """Bad case 3 of issue 20 through the loader: the over-long row is dropped and named, per row,
    in the prepared-data record beside the prepared dataset; the other rows train. A run's report
    shows the round's counts and where the record is."""
    from transformers import AutoTokenizer

    from pofe.data.loader import LOG, _prepare

    data = tmp_path / "rows.jsonl"
    rows = [
        {"prompt": "1+1=", "responses": ["2", "3"], "rewards": [1.0, 0.0]},
        {"prompt": "1" * 80, "responses": ["2" * 50 + "3", "2" * 50 + "4"], "rewards": [1.0, 0.0]},
        {"prompt": "2+2=", "responses": ["4", "5"], "rewards": [1.0, 0.0]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DictDefault(yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf").read_text()))
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"})
    folder = RunFolder(tmp_path / "run")
    record = folder.prepared(1) / "length-policy-0123.json"
    LOG.logger.addHandler(caplog.handler)
    try:
        dataset = _prepare(cfg, pofe_config(cfg), AutoTokenizer.from_pretrained(tiny_model), record)
    finally:
        LOG.logger.removeHandler(caplog.handler)
    assert len(dataset) == 2 and "drop_reason" not in dataset.column_names
    (entry,) = json.loads(record.read_text())["datasets"]
    assert entry["rows_dropped"] == {"prompt_too_long": 1}
    assert entry["per_row"] == [{"row": 1, "dropped": "prompt_too_long", "turns_cut": 0, "responses_cut": 0}]
    assert "1 of 3 rows of" in caplog.text and "dropped 1 (prompt_too_long 1)" in caplog.text
    assert str(record) in caplog.text

    RunState(folder.state, "r.yml", "f", "rrhf", rounds={"1": RoundRecord()}, starts=[1.0], rounds_planned=1).save()
    (cut,) = [r["truncation"] for r in collect(folder)["rounds"]]
    assert cut == {
        "record": str(record),
        "sequence_len": cfg.sequence_len,
        "truncation": "truncate",
        "rows": 3,
        "rows_over_sequence_len": 1,
        "rows_with_turns_cut": 0,
        "rows_with_responses_cut": 0,
        "rows_dropped": {"prompt_too_long": 1},
    }
    md = render_markdown(collect(folder), {})
    assert (
        f"| 1 | 1 of 3 | truncate at {cfg.sequence_len} | 0 | 0 | 1 (prompt_too_long 1) | `{record}` |"
        in md.split("### Length policy")[1]
    )


def test_every_prompt_too_long_names_the_cause_and_the_key(tmp_path, tiny_model):
    """Every prompt's one user turn (80 digits) over max_prompt_len (sequence_len 64 // 2 = 32 tokens):
    the error names the count, the cause (prompt_too_long) and max_prompt_len, and does not advise
    pofe.truncation: truncate, which is already set. Under truncation: drop it does."""
    from transformers import AutoTokenizer

    from pofe.data.loader import _prepare

    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": str(d) * 80, "responses": ["2", "3"], "rewards": [1.0, 0.0]} for d in range(1, 4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = yaml.safe_load(recipe(tmp_path, tiny_model, "rrhf", data, "pofe.rrhf").read_text())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    said = {}
    for truncation in ("truncate", "drop"):
        cfg = validated_recipe({**raw, "pofe": {**raw.get("pofe", {}), "truncation": truncation}}, CPU)
        with pytest.raises(ValueError) as refused:
            _prepare(cfg, pofe_config(cfg), tokenizer, None)
        said[truncation] = str(refused.value)
    assert said["truncate"] == (
        "no rows left to train on: 3 of 3 rows dropped by the length policy ({'prompt_too_long': 3}). "
        "prompt_too_long: a prompt's last user turn alone is longer than pofe.max_prompt_len=32 tokens; raise "
        "pofe.max_prompt_len (default sequence_len // 2) or sequence_len"
    )
    assert said["drop"] == (
        "no rows left to train on: 3 of 3 rows dropped by the length policy ({'too_long': 3}): longer than "
        "sequence_len=64. Raise sequence_len, or set pofe.truncation: truncate"
    )


def test_candidates_summary_records_the_length_policy_per_row(tmp_path, tiny_model):
    """Candidates generated from prompts: the rows the length policy touched are named in the
    candidates' summary.json (which travels with them to the hub) as well, rows of data.jsonl.
    SPPO keeps all K samples, so data.jsonl holds one row per prompt, in order."""
    from transformers import AutoTokenizer

    from pofe.data.loader import _prepare

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("1+1=", "1" * 80, "2+2=")))
    pofe = {
        "generate": {
            "backend": "transformers",
            "num_candidates": 2,
            "temperature": 1.0,
            "max_new_tokens": 3,
            "seed": 0,
        },
        "judge": {"type": "python", "function": "pofe.demo.task:reward"},
    }
    cfg = DictDefault(
        yaml.safe_load(recipe(tmp_path, tiny_model, "sppo", data, "pofe.prompts", pofe=pofe).read_text())
    )
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=CPU, env_capabilities={"torch_version": "2.13.0"})
    normalize_config(cfg)  # axolotl's tokenizer loader reads what it fills (tokenizer_config)
    dataset = _prepare(cfg, pofe_config(cfg), AutoTokenizer.from_pretrained(tiny_model))
    assert len(dataset) == 2
    (summary_path,) = (tmp_path / "prepared").glob("pofe-candidates-*/summary.json")
    policy = json.loads(summary_path.read_text())["length_policy"]
    assert policy["sequence_len"] == 64 and policy["truncation"] == "truncate"
    assert policy["rows"] == 3 and policy["rows_dropped"] == {"prompt_too_long": 1}
    assert policy["per_row"] == [{"row": 1, "dropped": "prompt_too_long", "turns_cut": 0, "responses_cut": 0}]
    assert summary_path.stat().st_mode & 0o777 == 0o600
