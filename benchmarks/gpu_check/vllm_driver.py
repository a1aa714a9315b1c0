"""Run inside vLLM's venv (no POFE import): K samples for each prompt given as token ids, and the
same prompts once as text, reporting the prompt ids vLLM conditioned on.

    python vllm_driver.py REQUEST.json RESULT.json
"""

import json
import sys
import time

from vllm import LLM, SamplingParams


def main(request_path: str, result_path: str) -> None:
    req = json.loads(open(request_path).read())
    llm = LLM(
        model=req["model"],
        seed=0,
        gpu_memory_utilization=req["gpu_memory_utilization"],
        max_model_len=req["max_model_len"],
        enforce_eager=req["enforce_eager"],
    )
    # one engine seed (LLM(seed=0)): per-request seeds with top_p fail on vLLM's CPU sampler
    sampling = SamplingParams(n=req["n"], temperature=0.7, top_p=0.9, max_tokens=req["max_tokens"])
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": ids} for ids in req["prompts"]], sampling)
    seconds = time.perf_counter() - start
    used = None
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            used = (total - free) / 2**30
    except ImportError:
        pass
    text = [llm.get_tokenizer().decode(ids) for ids in req["prompts"]]  # what a text prompt would send
    as_text = llm.generate(text, SamplingParams(max_tokens=1))
    json.dump(
        {
            "seen": [list(o.prompt_token_ids) for o in outs],
            "samples": [[list(c.token_ids) for c in o.outputs] for o in outs],
            "text_seen": [list(o.prompt_token_ids) for o in as_text],
            "seconds": seconds,
            "device_used_gib": used,
        },
        open(result_path, "w"),
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
