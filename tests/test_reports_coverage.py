"""Fast version of benchmarks/report_coverage.py: 95% intervals cover planted values ~95% of the time.

The benchmark runs >= 200 simulated experiments (see benchmarks/README.md); this test runs 60
(300 Shapley intervals, 900 effect intervals) so it stays within a few seconds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "report_coverage.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("report_coverage", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_intervals_cover_planted_values():
    table = _load_benchmark().run(experiments=60, seeds=3, noise_sd=0.015, seed_sd=0.01, n_boot=1000, seed=1)
    coverage = table.set_index("family")["coverage"]
    assert set(coverage.index) == {"shapley", "banzhaf", "paper_delta", "effects"}
    assert coverage.between(0.90, 0.99).all(), table
