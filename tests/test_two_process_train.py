"""`axolotl train` with two processes on the CPU (torchrun, gloo) matches one process.

axolotl 0.19 maps every rank's model to an accelerator when world_size > 1; the plugin's
`pre_model_load` places it on the CPU where none exists (`pofe.distributed.place_ranks_on_cpu`).
Two ranks at micro-batch 2 see the same global batches as one process at micro-batch 4,
so the logged losses and gradient norms of the first steps (after updates: the gradients
were averaged over the ranks) must equal the one-process run's. Small logit chunks, and
prefix sharing in its `auto` layout, so the ranks score unequal numbers of chunks and
decide the layout together.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import AXOLOTL_ENV, log_history, recipe

STEPS = 3
pytestmark = pytest.mark.e2e


def train(tmp_path: Path, model: Path, method: str, data: Path, processes: int) -> tuple[list[dict], str]:
    """Run `axolotl train` on `processes` CPU processes at a global batch of 4; its step logs and stdout."""
    tmp_path.mkdir()
    cfg = recipe(
        tmp_path, model, method, data, f"pofe.{method}", micro_batch_size=4 // processes, max_steps=STEPS,
        save_strategy="steps", save_steps=STEPS, pofe={"logit_chunk_size": 16, "eta": 10.0} if method == "sppo"
        else {"logit_chunk_size": 16},
    )
    bin_dir = Path(sys.executable).parent
    launcher = ["--launcher", "python"] if processes == 1 else [
        "--launcher", "torchrun", "--", "--standalone", "--nproc_per_node", str(processes)  # --standalone: a free port
    ]
    env = {**os.environ, **AXOLOTL_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([str(bin_dir / "axolotl"), "train", str(cfg), *launcher], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    steps = [h for h in log_history(tmp_path / "out") if "loss" in h]
    assert [h["step"] for h in steps] == list(range(1, STEPS + 1))
    return steps, proc.stdout + proc.stderr


@pytest.mark.parametrize("method", ["rrhf", "sppo"])
def test_two_processes_match_one(tmp_path, tiny64_model, rrhf_jsonl, sppo_jsonl, method):
    data = {"rrhf": rrhf_jsonl, "sppo": sppo_jsonl}[method]
    two, log = train(tmp_path / "two", tiny64_model, method, data, processes=2)
    one, _ = train(tmp_path / "one", tiny64_model, method, data, processes=1)
    assert "rank 0 of 2 trains on the CPU (MULTI_CPU, gloo)" in log  # axolotl prints rank 0 only
    # 3 steps of 4 rows out of 32: a quarter of an epoch unless each rank trained alone
    assert two[-1]["epoch"] == pytest.approx(STEPS * 4 / 32)
    for a, b in zip(two, one):
        for key in ("loss", "grad_norm", f"{method}/{'rank' if method == 'rrhf' else 'logratio'}"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (a["step"], key)
    if method == "sppo":  # the anchor pass was sharded: both ranks scored, the table is whole
        assert "computed SPPO anchor log-probs for 32 rows" in log and "on 2 process(es)" in log
