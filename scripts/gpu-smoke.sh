#!/usr/bin/env bash
# Smoke test of the runtime's CUDA/NCCL path on a machine with one GPU or more (about 3-6 minutes).
# Prints one line per check and a step-time table; exit 0 all passed, 1 a check failed, 2 no CUDA.
# Usage: scripts/gpu-smoke.sh [--quick]   (from the repository root; uses .venv/bin/python if present)
# Then, as a second call: .venv/bin/python scripts/gpu_qwen_vl.py (Qwen2.5-VL step time and MFU per plan, 4-6 min).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec timeout 600 "$PY" scripts/gpu_smoke.py "$@"
