"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_hostile_reports_factors.py
describes; its docstring says what they check."""

from __future__ import annotations

import subprocess
import sys

TWELVE = """
import numpy as np
from dapo_ablate.reports import analyze
from dapo_ablate.reports.simulate import simulate_results
factors = [f"f{i}" for i in range(12)]
results = simulate_results(factors, 0.3, {("f0",): 0.05, ("f1", "f2"): 0.03}, 1, 0.01, rng=0)
analysis = analyze(results, factors)
print(len(analysis.fit.masks), analysis.lenth is not None, len(analysis.all_effects))
"""


def test_twelve_factors_analyse_and_return():
    """4,096 cells, one run each (Lenth's method over 4,095 effects): it must return; the timeout
    is far above the seconds it takes, and only catches the cubic path (tens of minutes)."""
    done = subprocess.run([sys.executable, "-c", TWELVE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["4096", "True", "4095"]
