#!/usr/bin/env bash
# POFE step benchmark on one CUDA GPU: a ~1.1B-parameter Llama (TinyLlama's shape, random
# weights from a config), bf16, full fine-tuning and QLoRA (nf4, LoRA r=16 on all linear
# layers). Same workloads and variants as `python -m benchmarks.run`; reports unique
# tokens/s, extra peak memory per step (torch.cuda.max_memory_allocated) and the ratios.
#
#   benchmarks/gpu.sh                # on a GPU machine, from anywhere in the repository
#   benchmarks/gpu.sh --tiny         # CPU smoke test of the same code path (tiny model, fp32)
#   benchmarks/gpu.sh --reps 20      # extra arguments go to benchmarks.run
#
# Needs the project's venv (torch with CUDA, transformers, peft, bitsandbytes for QLoRA).
# Writes benchmarks/results/1b-cuda.json (or gpu-smoke-cpu.json with --tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"

if [[ "${1:-}" == "--tiny" ]]; then
  shift
  exec "$PY" -m benchmarks.run --device cpu --model tiny --dtype float32 --modes full,qlora \
    --quick --out benchmarks/results/gpu-smoke-cpu.json "$@"
fi

"$PY" - <<'PYCHECK'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("benchmarks/gpu.sh: no CUDA device (use --tiny for a CPU smoke test)")
if not torch.cuda.is_bf16_supported():
    sys.exit("benchmarks/gpu.sh: this GPU has no bf16")
print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
PYCHECK

exec "$PY" -m benchmarks.run --device cuda --model 1b --dtype bf16 --modes full,qlora \
  --reps 10 --out benchmarks/results/1b-cuda.json "$@"
