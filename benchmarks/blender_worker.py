"""llm-blender 0.0.2's own PairRM calls, timed on command; run by benchmarks/judges.py.

    .venv-pairrm/bin/python benchmarks/blender_worker.py RANKER_DIR INPUTS_JSON DEVICE THREADS

Runs in the reference venv of the PairRM parity test (.ci/pairrm-reference.sh: llm-blender
does not import on transformers >= 5), so it imports nothing of POFE. Loads the ranker once
with `Blender.loadranker`, then answers one JSON line per command line on stdin:
{"op": "rank" | "compare", "batch_size": b} -> {"seconds": s, "scores": ...}.
`rank` is `Blender.rank(sources, candidates, return_scores=True)`, as the SPPO scripts call
it; `compare` judges every unordered pair of each prompt's candidates with
`Blender.compare(..., mode="[A,B]+[B,A]")` (both orders), the same ordered pairs.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import llm_blender
    import torch

    reply, sys.stdout = sys.stdout, sys.stderr  # llm-blender prints: keep stdout for the replies
    ranker_dir, inputs_path, device, threads = sys.argv[1:5]
    torch.set_num_threads(int(threads))
    data = json.loads(open(inputs_path).read())
    sources, candidates = data["sources"], data["candidates"]
    blender = llm_blender.Blender()
    blender.loadranker(ranker_dir, device=device)
    pairs = [(s, c[i], c[j]) for s, c in zip(sources, candidates) for i in range(len(c)) for j in range(i + 1, len(c))]
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        clock = time.perf_counter if device == "cuda" else time.process_time  # as judges.py's `clock`
        sync()
        start = clock()
        if cmd["op"] == "rank":
            out = blender.rank(
                sources, candidates, return_scores=True, batch_size=cmd["batch_size"], disable_tqdm=True
            )
        else:
            out = blender.compare(
                [s for s, _, _ in pairs],
                [a for _, a, _ in pairs],
                [b for _, _, b in pairs],
                batch_size=cmd["batch_size"],
                return_logits=True,
                mode="[A,B]+[B,A]",
                disable_tqdm=True,
            )
        sync()
        seconds = clock() - start
        print(
            json.dumps(
                {
                    "seconds": seconds,
                    "scores": [list(map(float, r)) for r in out] if cmd["op"] == "rank" else list(map(float, out)),
                }
            ),
            file=reply,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
