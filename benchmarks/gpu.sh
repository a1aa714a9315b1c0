#!/usr/bin/env bash
# POFE step benchmark on one CUDA GPU: a ~1.1B-parameter Llama (TinyLlama's shape, random
# weights from a config), bf16, full fine-tuning and QLoRA (nf4, LoRA r=16 on all linear
# layers). Same workloads and variants as `python -m benchmarks.run`, once per attention
# backend: sdpa (packed and cache layouts), flash attention 2 and FlexAttention (the cache
# layout: they take no custom 4D mask). Reports unique tokens/s, extra peak memory per step
# (torch.cuda.max_memory_allocated) and the ratios.
#
#   benchmarks/gpu.sh                # on a GPU machine, from anywhere in the repository
#   benchmarks/gpu.sh --tiny         # CPU smoke test of the same code path (tiny model, fp32, sdpa)
#   benchmarks/gpu.sh --reps 20      # extra arguments go to benchmarks.run
#   ATTNS="sdpa flex_attention" benchmarks/gpu.sh   # a subset of the backends
#
# Needs the project's venv (torch with CUDA, transformers, peft, bitsandbytes for QLoRA;
# flash-attn for flash_attention_2, skipped with a line when it is not installed).
# Writes benchmarks/results/1b-cuda-<attn>.json (or gpu-smoke-cpu.json with --tiny).
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

for attn in ${ATTNS:-sdpa flash_attention_2 flex_attention}; do
  if [[ "$attn" == flash_attention_2 ]] && ! "$PY" -c "import flash_attn" 2>/dev/null; then
    echo "benchmarks/gpu.sh: flash_attn not installed, skipping flash_attention_2 (pip install flash-attn)"
    continue
  fi
  "$PY" -m benchmarks.run --device cuda --model 1b --dtype bf16 --modes full,qlora --attn "$attn" \
    --reps 10 --out "benchmarks/results/1b-cuda-$attn.json" "$@"
done
