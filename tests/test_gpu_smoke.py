"""benchmarks/gpu_smoke.sh in its CPU mode: builds the real-vocabulary checkpoint offline, times
the engine(s), runs 3 DAPO steps in bf16 with fp32 masters and prints one line of figures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_smoke_script_runs_on_cpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_smoke.sh"), "--cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("gpu_smoke: ")]
    assert len(lines) == 1, proc.stdout[-2000:]
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["vocab"] == 151_936 and figures["device"] == "cpu"
    assert figures["steps"] == 3 and figures["tokens"] > 0 and figures["hf_tok_s"] > 0
    assert float(figures["grad_norm"]) > 0  # the update had a signal (varied lengths, soft penalty)
    assert (figures["compute"], figures["masters"]) == ("bf16", "fp32")
    config = json.loads((tmp_path / "checkpoint" / "config.json").read_text())
    assert config["vocab_size"] == 151_936
