#!/usr/bin/env bash
# Recompute tests/candidates/fixtures/pairrm/reference.json with llm-blender's OWN code:
# a separate venv holds llm-blender 0.0.2 (it does not import on transformers >= 5), and
# tests/candidates/make_pairrm_reference.py builds the tiny seeded checkpoint in
# llm-blender/PairRM's layout, loads it with Blender.loadranker and records token ids,
# pairwise logits and rank scores. tests/candidates/test_pairrm.py compares POFE against them.
#
# Usage: .ci/pairrm-reference.sh        (venv at $PAIRRM_VENV, default <repo>/.venv-pairrm)
# About 1 minute to build the venv (CPU torch from the local wheel), 10 seconds to run.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PAIRRM_VENV:-$REPO/.venv-pairrm}"
PY="${PAIRRM_PYTHON:-python3.11}"

if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import llm_blender" >/dev/null 2>&1; }; then
    echo "creating llm-blender venv at $VENV"
    "$PY" -m venv "$VENV"
    # CPU torch first, so pip does not pull a CUDA build for llm-blender's unpinned `torch`.
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q llm-blender==0.0.2 'transformers<5' torch==2.13.0
fi
cd "$REPO"
OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 "$VENV/bin/python" tests/candidates/make_pairrm_reference.py "$@"
