"""benchmarks/suite_costs.py, the tool that finds where the suite's time goes: run as a pytest
plugin on a small test file, it records each test once with the CPU time of the process that test
reaped, and its summary groups the records by module. No time is asserted, only what was recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import BENCHMARKS

SAMPLE = '''
import subprocess, sys

def test_spends_cpu_in_a_child():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_quick():
    assert True
'''


def test_each_test_is_recorded_once_with_what_its_children_cost_and_summarised_by_module(tmp_path: Path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    costs = tmp_path / "costs"
    environment = {**os.environ, "PYTHONPATH": str(BENCHMARKS), "SUITE_COSTS_DIR": str(costs)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_costs", "-p", "no:cacheprovider",
                           "test_sample.py"], cwd=tmp_path, env=environment, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    records = {r["test"]: r for path in costs.glob("*.jsonl") for r in map(json.loads, path.read_text().splitlines())}
    assert set(records) == {"test_sample.py::test_spends_cpu_in_a_child", "test_sample.py::test_quick"}
    child, quick = records["test_sample.py::test_spends_cpu_in_a_child"], records["test_sample.py::test_quick"]
    assert child["reaped_cpu_s"] > 0 and quick["reaped_cpu_s"] == 0
    assert child["wall_s"] > 0 and child["ray_starts"] == 0

    summary = subprocess.run([sys.executable, str(BENCHMARKS / "suite_costs.py"), "--dir", str(costs)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    first, header, module = summary.splitlines()
    assert first.startswith("2 tests: wall_s ") and "module" in header
    assert module.split() == [*module.split()[:4], "2", "test_sample.py"]
