#!/usr/bin/env bash
# GPU smoke run, offline, under 8 minutes on one GPU: a random-init Qwen2.5-0.5B-shaped checkpoint
# with the real vocabulary (151,936), vLLM vs HF engine tokens/s on one batch, 3 DAPO steps with
# vLLM rollouts in bf16 with fp32 master weights, one line of figures (`gpu_smoke: ...`).
#   bash benchmarks/gpu_smoke.sh [--cpu] [--engine auto|vllm|hf] [--out DIR]
#   bash benchmarks/gpu_smoke.sh verl [--cpu] [--out DIR]   # the verl backend: two real verl DAPO cells
#     through `dapo-ablate run` and a local Ray head (benchmarks/gpu_smoke_verl.py; PYTHON defaults to
#     .venv-verl's, a verl environment: pip install -e ".[verl]")
# --cpu (or no GPU): a smaller shape with the same vocabulary, so that it runs (slowly) on CPU and
# is tested there (tests/e2e/test_gpu_smoke.py). PYTHON picks the interpreter (default: .venv's).
set -euo pipefail
cd "$(dirname "$0")/.."
# offline: nothing is fetched (the checkpoint is built locally) and nothing is reported
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export VLLM_NO_USAGE_STATS="${VLLM_NO_USAGE_STATS:-1}" DO_NOT_TRACK="${DO_NOT_TRACK:-1}"
if [ "${1:-}" = "verl" ]; then
  shift
  PY="${PYTHON:-.venv-verl/bin/python}"
  [ -x "$PY" ] || PY=python3
  exec timeout 1800 "$PY" benchmarks/gpu_smoke_verl.py "$@"
fi
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec timeout 480 "$PY" benchmarks/gpu_smoke.py "$@"
