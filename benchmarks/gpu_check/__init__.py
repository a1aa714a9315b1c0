"""The one-GPU check (`benchmarks/gpu_check.sh`): what the first lent GPU must show, in two calls.

    python -m benchmarks.gpu_check            # one CUDA GPU, no downloads
    python -m benchmarks.gpu_check --tiny     # the same code path on the CPU with a tiny model

Stages, each a module: `model` (a random ~1B Llama and a tokenizer that writes and adds BOS),
`train` (SPPO and RRHF through `axolotl train`: full fine-tuning, and QLoRA with axolotl's LoRA
kernels off and on), `online` (online RRHF with QLoRA and the KL penalty: the training model
samples on the GPU, the adapter-disabled base scores as pi_0; and `nash_md`, online Nash-MD with
QLoRA, the mixture's opponents sampled token by token with pi_0's logits from the same model), `generate` (K = 5 from token ids through POFE's transformers backend, the
prompt-identity check of issue 18; vLLM too where there is one), `prefix` (prefix sharing against
the unshared layout on each attention backend, in numbers and time; chunked scoring's memory),
`speed` (the CPU benchmark's ratios, tokens/s and MFU), `judges` (the reward-model judge against a
plain forward, and SPPO's anchor pass against one epoch's forwards, issue 22) and `plan` (each
run's peak memory beside `axolotl pofe plan`'s estimate). `report` prints the table and writes the
JSON. A row is `pass`, `FAIL`, `measured` (speed, memory), `needs GPU` (it needs CUDA and runs on
the GPU) or `skipped: <why>`; only `pass` passes.

The GPU machine this project can be lent has no axolotl: `bundle` downloads what it lacks as wheels
and prints the commands that run the check there; `clean_venv` shows, without a GPU, that the
bundle holds what the check imports.
"""
