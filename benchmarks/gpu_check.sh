#!/usr/bin/env bash
# The one-GPU check (issues 21 and 37), no downloads. It builds a ~1.1B Llama (TinyLlama's shape,
# random weights, bf16) with Mistral v0.2's tokenizer (its template writes BOS and it adds BOS),
# then, stage by stage: SPPO and RRHF, 20 steps each through `axolotl train`, full fine-tuning
# and QLoRA with axolotl's LoRA kernels off and on (train); online RRHF with QLoRA and its KL penalty,
# the training model sampling on the GPU (online); K = 5 samples for 64 prompts from
# token ids with issue 18's prompt-identity check through POFE's transformers backend
# (generate) and vLLM where there is one (vllm); prefix sharing against the unshared layout on
# sdpa, flash-attention-2 and FlexAttention, in numbers and time, and chunked scoring's memory
# against unchunked (prefix); the CPU benchmark's ratios, tokens/s and MFU (speed); the
# reward-model judge against a plain forward and the anchor pass against an epoch's forwards
# (judges); each run's peak GPU memory beside `axolotl pofe plan`'s estimate. One table; JSON in
# benchmarks/results/ (or --out).
#
#   benchmarks/gpu_check.sh                        # one CUDA GPU
#   benchmarks/gpu_check.sh --tiny                 # the same path on the CPU (tiny model, 2 steps);
#                                                  # what needs CUDA says "needs GPU", never "pass"
#   benchmarks/gpu_check.sh --stages train         # stages: train, online, generate, vllm, prefix, speed, judges
#   benchmarks/gpu_check.sh --skip speed
#
# On the GPU machine this project can be lent (no axolotl there): `python -m
# benchmarks.gpu_check.bundle` downloads the wheels it lacks into .whl/ and prints the commands
# that install them and run this script there, in two calls. Elsewhere: the project's venv
# (flash-attn for flash_attention_2, else that row is skipped) and a vLLM venv (VLLM_PYTHON or
# VLLM_VENV, default .venv-vllm; without one the vLLM row is skipped).
# Exits 1 when a row is FAIL. Work files: ${WORK:-/tmp/pofe-gpu-check}.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
export PATH="$(dirname "$(command -v "$PY")"):$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled
exec "$PY" -m benchmarks.gpu_check --work "${WORK:-/tmp/pofe-gpu-check}" "$@"
