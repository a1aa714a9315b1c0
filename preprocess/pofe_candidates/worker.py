"""One candidate worker process: `python -m pofe_candidates.worker SPEC WORKER PARENT_PID`.

Started by `parallel.run_workers`, never by hand. Runs the generate stage, then the judge
stage, on the shards it owns (`parallel.owned_shards`), and writes its report
(`workers/worker-N.json`) for the parent. It ends when the parent does, however the parent
ends (Linux: the kernel's parent-death signal), so a killed run leaves no worker holding
its GPUs.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import signal
import sys
from pathlib import Path

from pofe_candidates.parallel import owned_shards, write_report
from pofe_candidates.pipeline import run_stages

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _end_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it ended before the signal was armed
        sys.exit(f"candidate worker: parent process {parent_pid} has ended")


def main(spec_path: str, worker: int, parent_pid: int) -> None:
    _end_with_parent(parent_pid)
    spec = pickle.loads(Path(spec_path).read_bytes())
    plan = spec["plan"]
    n = plan.candidates.num_workers
    shards = owned_shards(worker, n, math.ceil(len(plan.rows) / plan.candidates.shard_size))
    print(f"POFE candidate worker {worker} of {n} (pid {os.getpid()}): shards {shards}", flush=True)
    folder = Path(spec_path).parent
    done = run_stages(
        plan,
        owned=shards,
        tokenizer=spec["tokenizer"],
        stop_after=spec["stop_after"],
        workdir=folder / f"worker-{worker}",
    )
    write_report(
        folder,
        worker,
        {
            "worker": worker,
            "shards": shards,
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "redone": done.redone,
            "timings": done.timings,
            "requests": done.requests,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
