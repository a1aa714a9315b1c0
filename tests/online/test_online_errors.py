"""Failures of online training and of the stages around it as `axolotl train` and `axolotl preprocess`
show them (issue 50's still-weak cases): each names the file, the row or the path concerned, and
what to do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import AXOLOTL_ENV, run_axolotl
from tests.helpers import TESTS_ON_PATH as JUDGES_ENV
from tests.online.test_online_e2e import _toy

pytestmark = pytest.mark.e2e

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


def _answers_with_its_end_of_turn_alone(model_dir: str) -> None:
    """Rewrite the tiny model in `model_dir` so that it samples its end-of-turn token first, whatever
    the prompt: each layer's output projections zeroed (the last hidden state is the last token's
    embedding), every embedding's first entry 1 and the final norm keeping only that entry, so the
    output layer sees one positive number, which it gives the EOS token alone (x 50: a logit of
    several hundred, every other token's 0)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert not model.config.tie_word_embeddings
    eos = model.config.eos_token_id
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[eos, 0] = 50.0
    model.save_pretrained(model_dir)


# what both stages say of a policy that answers every prompt with its end of turn alone, up to its rows
SILENT = (
    r"POFE: {where}: {samples} of {samples} samples were empty \(the policy ended its turn at once\), and every "
    r"sample of {prompts} of {prompts} prompts was: ({row}; ){{4}}{row}; and {more} more\. The samples are in "
    r"{samples_at}; check the policy's chat template's generation prompt and its end-of-turn token, or raise "
    r"pofe\.generate\.temperature"
)


def test_a_policy_that_only_ends_its_turn_is_said_at_the_refresh(tmp_path):
    """Online RRHF from a policy that samples nothing but its end of turn: the refresh at step 0 says
    that all 240 samples (60 prompts x 4) were empty and which prompts' rows, before the error that
    no prompt kept 2 candidates (the answer alone is left); it said only the latter, counting the
    empty candidates among the removed ones."""
    path, recipe, _ = _toy(tmp_path, RECIPE, micro_batch_size=60, max_steps=1)
    _answers_with_its_end_of_turn_alone(recipe["base_model"])
    proc = run_axolotl("train", str(path), cwd=tmp_path, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    folder = Path(recipe["output_dir"]) / "online" / "refresh-0000000" / "generate.jsonl"
    expected = SILENT.format(
        where="online refresh at step 0",
        samples=240,
        prompts=60,
        row=rf"dataset {re.escape(recipe['datasets'][0]['path'])}, row \d+ \(0-based\)",
        more=55,
        samples_at=re.escape(str(folder)),
    )
    assert re.search(expected, said), said[-3000:]
    assert "no prompt of micro-batch 0 (prompts" in said


def test_a_policy_that_only_ends_its_turn_is_said_by_preprocess(tmp_path):
    """The offline recipe's candidates from the same policy (`axolotl preprocess`): the answer and
    its three near misses give every prompt candidates to train on, so the stage ended without a
    word of the 240 empty samples; it says them now, naming the generate folder."""
    path, recipe, _ = _toy(tmp_path, "tiny-rrhf-cpu.yml")
    _answers_with_its_end_of_turn_alone(recipe["base_model"])
    proc = run_axolotl("preprocess", str(path), cwd=tmp_path)
    said = proc.stdout + proc.stderr
    silent = SILENT.format(
        where="the generate stage", samples=240, prompts=60, row=r"dataset row \d+", more=55, samples_at=r"(\S+)"
    )
    found = re.search(silent, said)
    assert found, said[-3000:]
    assert Path(found.group(2)).is_dir() and list(Path(found.group(2)).glob("*.jsonl"))


# `sh -c` with $1 a size, $2 a folder, $3 a folder of files, then a command: a tmpfs of that size
# mounted at $2 in a mount namespace of its own (`unshare -rm`: no privilege needed), $3's files
# copied in, then zeros to the last byte (a disk full before the command writes there); the command
# runs, and what the tmpfs then holds is listed on stderr (the namespace ends with the shell)
ON_A_FULL_DISK = (
    'mount -t tmpfs -o size="$1" tmpfs "$2" && cp -a "$3"/. "$2"/ && { dd if=/dev/zero of="$2/filler" bs=4k '
    '2>/dev/null; true; } && disk="$2" && shift 3 && "$@"; status=$?; echo "left on the disk:" >&2; '
    'ls -a "$disk" >&2; exit $status'
)


def test_a_full_disk_under_the_anchor_table_names_it_and_leaves_no_temporary_file(tmp_path):
    """SPPO's anchor table is written beside the prepared rows at the first step; there the disk is
    full (a tmpfs of the test's own, the prepared rows copied in first). `axolotl train` stops
    naming the table's file, errno 28 and what to do, and leaves no temporary file (it raised
    torch.save's error, which names no file, and left `pofe-anchor-<hash>.tmp`)."""
    path, recipe, _ = _toy(tmp_path, "tiny-sppo-cpu.yml", max_steps=1)
    run_axolotl("preprocess", str(path), cwd=tmp_path)
    prepared = Path(recipe["dataset_prepared_path"])
    saved = prepared.rename(tmp_path / "saved")
    prepared.mkdir()
    # axolotl's loader counts its processes in this file, removed by the last one after loading: one
    # counted already (as if a second process were loading), the file keeps its page
    (saved / "process_counter.txt").write_text("1")
    bin_dir = Path(sys.executable).parent
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", ON_A_FULL_DISK, "sh", "8m", str(prepared), str(saved)]
        + [str(bin_dir / "axolotl"), "train", str(path), "--launcher", "python"],
        cwd=tmp_path,
        env={**os.environ, **AXOLOTL_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    at = re.escape(str(prepared))
    assert re.search(
        rf"Error: could not write {at}/pofe-anchor-[0-9a-f]+\.pt: No space left on device \(errno 28\)\. Nothing of "
        rf"it was left half-written\. Free space on the disk holding {at} \(or make it writable\), then run again\.",
        said,
    ), said[-3000:]
    left = said[said.rindex("left on the disk:") :].split()
    assert not [name for name in left if name.startswith("pofe-anchor")], left
