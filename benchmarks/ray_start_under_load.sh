#!/usr/bin/env bash
# A local Ray start on an overloaded machine: BUSY spinning processes, each in a session of its own (as
# the processes of other programs are), for SECONDS, while a 4-run `dapo-ablate run` of a stand-in cell
# starts its own Ray. Prints the run's exit status and time, and for each Ray session it started whether
# it started or how it failed (Ray's fixed waits: the driver's for its raylet, the raylet's for its
# dashboard agent); the product then tries again after a pause (ablation/runtime/ray_connect.py).
#   bash benchmarks/ray_start_under_load.sh [BUSY] [SECONDS]   # default 60 processes for 240 s
set -euo pipefail
cd "$(dirname "$0")/.."
BUSY=${1:-60}
SECONDS_BUSY=${2:-240}
WORK=$(mktemp -d)
cat > "$WORK/spec.yaml" <<SPEC
name: ray-start-under-load
trainer: {rollout: {max_response_len: 64}, algorithm: {overlong_cache: 8}}
factors: [overlong_filter, clip_higher]
seeds: 1
output_dir: $WORK/out
ledger: sqlite:///$WORK/out/ledger.db
tracking: {uri: sqlite:///$WORK/out/mlflow.db}
SPEC
before=$(ls -d /tmp/ray/session_2* 2>/dev/null | sort || true)
spinners=()
for _ in $(seq "$BUSY"); do
  setsid timeout "$SECONDS_BUSY" sh -c 'while :; do :; done' >/dev/null 2>&1 &
  spinners+=($!)
done
started=$(date +%s)
set +e
DAPO_ABLATE_CELL_FN=support:counting_cell PYTHONPATH="$PWD/tests" timeout 1800 \
  .venv/bin/dapo-ablate run "$WORK/spec.yaml" --no-progress > "$WORK/run.log" 2>&1
rc=$?
set -e
echo "dapo-ablate run: exit $rc after $(( $(date +%s) - started )) s, beside $BUSY busy processes for $SECONDS_BUSY s"
tail -n 3 "$WORK/run.log"
after=$(ls -d /tmp/ray/session_2* 2>/dev/null | sort || true)
for session in $(comm -13 <(echo "$before") <(echo "$after")); do
  log="$session/logs/raylet.out"
  if grep -q "Raylet of id, .* started" "$log" 2>/dev/null; then
    echo "  $(basename "$session"): started"
  elif grep -q "Timed out waiting for file" "$log" 2>/dev/null; then
    echo "  $(basename "$session"): failed: the raylet gave up waiting for its dashboard agent's port"
  else
    echo "  $(basename "$session"): failed: Ray's 30 s wait for the raylet passed before it started"
  fi
done
kill "${spinners[@]}" 2>/dev/null || true
rm -rf "$WORK"
