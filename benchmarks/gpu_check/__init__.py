"""The one-GPU check (`benchmarks/gpu_check.sh`): what the first lent GPU must show, in one run.

    python -m benchmarks.gpu_check            # one CUDA GPU (an H200: at most 8 minutes), no downloads
    python -m benchmarks.gpu_check --tiny     # the same code path on the CPU with a tiny model

Stages, each a module: `model` (a random ~1B Llama and a tokenizer that writes and adds BOS),
`generate` (vLLM, K = 5 from token ids, the prompt-identity check of issue 18), `train` (QLoRA
SPPO and RRHF through `axolotl train`, axolotl's LoRA kernels on and off), `prefix` (prefix
sharing against the unshared layout on each attention backend), `speed` (the CPU benchmark's
ratios and tokens/s), `judges` (the reward-model judge against a plain forward, and SPPO's anchor
pass against one epoch's forwards, issue 22) and `plan` (each stage's peak memory beside `axolotl pofe plan`'s
estimate). `report` prints the table and writes the JSON. A row is `pass`, `FAIL`, `measured`
(speed), `needs GPU` (it needs CUDA and runs on the GPU) or `skipped: <why>`; only `pass` passes.
"""
