#!/usr/bin/env bash
# The one-GPU check (issue 21): at most 8 minutes on one H200, no downloads. It builds a ~1.1B
# Llama (TinyLlama's shape, random weights, bf16) with Mistral v0.2's tokenizer (its template
# writes BOS and it adds BOS), then: vLLM K = 5 for 64 prompts from token ids with issue 18's
# prompt-identity check; QLoRA SPPO and RRHF, 20 steps each through `axolotl train`, axolotl's
# LoRA kernels on and off; prefix sharing against the unshared layout on sdpa,
# flash-attention-2 and FlexAttention; the CPU benchmark's ratios and tokens/s; the reward-model
# judge against a plain forward and the anchor pass against an epoch's forwards; each stage's
# peak GPU memory beside `axolotl pofe plan`'s estimate. One table; JSON in benchmarks/results/.
#
#   benchmarks/gpu_check.sh                   # one CUDA GPU
#   benchmarks/gpu_check.sh --tiny            # the same path on the CPU (tiny model, 2 steps); what
#                                             # needs CUDA says "needs GPU", never "pass"
#   benchmarks/gpu_check.sh --skip speed      # stages: generate, train, prefix, speed, judges
#
# Needs the project's venv (CUDA torch, bitsandbytes, flash-attn for flash_attention_2) and a
# vLLM venv (VLLM_PYTHON or VLLM_VENV, default .venv-vllm; without one the vLLM row is skipped).
# Exits 1 when a row is FAIL. Work files: ${WORK:-/tmp/pofe-gpu-check}.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
export PATH="$(dirname "$(command -v "$PY")"):$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled
exec "$PY" -m benchmarks.gpu_check --work "${WORK:-/tmp/pofe-gpu-check}" "$@"
