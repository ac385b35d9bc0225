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
# The bound on either run: one GPU, 8 minutes in all (the verl run's install included); --cpu (the
# smaller shape, or verl's CPU plugin, on cores shared with other work, as in CI): 30 minutes.
LIMIT=480; case " $* " in *" --cpu "*) LIMIT=1800;; esac
if [ "${1:-}" = "verl" ]; then
  shift
  # Offline install: with no verl environment here and a folder of wheels in $WHEELS (default
  # .wheels/, filled on a machine with a network by `pip download -d .wheels -e ".[verl]"` plus
  # flash-attn's wheel if one fits the GPU's CUDA), .venv-verl is built from it, nothing fetched.
  export WHEELS="${WHEELS:-.wheels}"
  exec timeout "$LIMIT" bash -c '
    set -euo pipefail
    if [ -z "${PYTHON:-}" ] && [ ! -x .venv-verl/bin/python ] && [ -d "$WHEELS" ]; then
      echo "gpu_smoke verl: installing .venv-verl from $WHEELS (offline)"
      python3 -m venv .venv-verl
      .venv-verl/bin/pip install -q --no-index --find-links "$WHEELS" -e ".[verl]"
      .venv-verl/bin/pip install -q --no-index --find-links "$WHEELS" flash-attn 2>/dev/null \
        || echo "gpu_smoke verl: flash-attn not in $WHEELS; the cells run with sdpa attention"
    fi
    PY="${PYTHON:-.venv-verl/bin/python}"
    [ -x "$PY" ] || PY=python3
    exec "$PY" benchmarks/gpu_smoke_verl.py "$@"' gpu_smoke_verl "$@"
fi
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec timeout "$LIMIT" "$PY" benchmarks/gpu_smoke.py "$@"
