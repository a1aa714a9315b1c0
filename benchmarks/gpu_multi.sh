#!/usr/bin/env bash
# POFE on two GPUs of one node: full fine-tuning of a ~1.1B Llama (TinyLlama's shape, random
# weights, bf16, gradient checkpointing) through `axolotl train` with DeepSpeed ZeRO-3 and
# with FSDP2, RRHF and SPPO, N steps each; then vLLM generation (benchmarks.preprocess).
# Prints per run the loss after N steps, unique tokens/s and the peak memory per GPU
# (benchmarks/multi.py summary). About 8 minutes on two H100-class GPUs at the defaults.
#
#   benchmarks/gpu_multi.sh              # 2 GPUs: zero3 and fsdp2 x rrhf and sppo, then vLLM
#   STEPS=10 BACKENDS=fsdp2 benchmarks/gpu_multi.sh
#   benchmarks/gpu_multi.sh --tiny       # CPU dry run of the same path: tiny model, 2 gloo
#                                        # processes (plain DDP: no ZeRO-3/FSDP on the CPU), 3 steps
#
# Needs the project's venv with CUDA torch and deepspeed for zero3, and a vLLM venv
# (VLLM_VENV) for the last step; each is skipped with a line when it is missing. Work files go to ${OUT:-/tmp/pofe-gpu-multi}.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
BIN="$(dirname "$(command -v "$PY")")"
export PATH="$BIN:$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 AXOLOTL_DO_NOT_TRACK=1 WANDB_MODE=disabled
OUT="${OUT:-/tmp/pofe-gpu-multi}"
MODEL=1b STEPS="${STEPS:-20}" BACKENDS="${BACKENDS:-zero3 fsdp2}" METHODS="${METHODS:-rrhf sppo}"
TINY=0
if [[ "${1:-}" == "--tiny" ]]; then
  TINY=1 MODEL=tiny STEPS=3 BACKENDS=ddp
  export OMP_NUM_THREADS=1
else
  "$PY" -c "import sys, torch; n = torch.cuda.device_count(); sys.exit(0 if n >= 2 else \
f'benchmarks/gpu_multi.sh: needs 2 CUDA GPUs, found {n} (use --tiny for a CPU dry run)')"
fi

for backend in $BACKENDS; do
  if [[ "$backend" == zero3 ]] && ! "$PY" -c "import deepspeed" 2>/dev/null; then
    echo "benchmarks/gpu_multi.sh: deepspeed not installed, skipping zero3 (pip install deepspeed)"
    continue
  fi
  for method in $METHODS; do
    recipe=$("$PY" -m benchmarks.multi prepare --out "$OUT" --model "$MODEL" --backend "$backend" \
      --method "$method" --steps "$STEPS" | tail -1)
    rm -rf "${recipe%.yml}"
    # --standalone: torchrun picks a free port
    axolotl train "$recipe" --launcher torchrun -- --standalone --nproc_per_node 2 > "${recipe%.yml}.log" 2>&1 \
      || { echo "$backend $method failed, see ${recipe%.yml}.log"; tail -20 "${recipe%.yml}.log"; exit 1; }
    "$PY" -m benchmarks.multi summary "${recipe%.yml}"
  done
done

if [[ "$TINY" == 0 ]]; then
  # benchmarks.preprocess serves the model from vLLM's own venv (VLLM_VENV, default .venv-vllm)
  if "${VLLM_VENV:-.venv-vllm}/bin/python" -c "import vllm" 2>/dev/null; then
    "$PY" -m benchmarks.preprocess --backend vllm
  else
    echo "benchmarks/gpu_multi.sh: no vLLM venv at ${VLLM_VENV:-.venv-vllm}, skipping generation"
  fi
fi
