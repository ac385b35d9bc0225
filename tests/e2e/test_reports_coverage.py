"""Fast versions of the report benchmarks: coverage of every estimand in three settings, and the
share of experiments with a false claim under the global null (benchmarks/README.md has the
full runs: 400 experiments per setting, 300 null experiments)."""

from __future__ import annotations

import importlib.util

import pytest

from support import ROOT


BENCHMARKS = ROOT / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("setting", ["balanced", "missing", "per-cell-seeds"])
def test_intervals_cover_planted_values(setting):
    table = _load("report_coverage").run(setting, experiments=40, seeds=3, noise_sd=0.015, seed_sd=0.01, seed=1)
    coverage = table.set_index("estimand")["coverage"]
    assert {"cells", "cumulative_mean", "orderings", "shapley", "banzhaf", "leave_one_out", "add_one", "effects"} <= set(
        coverage.index
    )
    assert coverage.between(0.88, 0.995).all(), table  # 40 experiments: a loose band around 95%


def test_few_false_claims_under_the_global_null():
    table = _load("report_false_claims").run(experiments=60, seeds=3, noise_sd=0.015, seed_sd=0.01, seed=2)
    assert (table["any"] > 0).mean() <= 0.15, table  # 300 experiments measure ~5%; 60 leave room


def test_heteroscedastic_null_keeps_coverage_and_claims_few():
    """4 of 32 cells with 3x the noise sd, 2 seeds, no effect anywhere: every claim is false."""
    table = _load("report_coverage").run(
        "balanced", experiments=40, seeds=2, noise_sd=0.015, seed_sd=0.01, seed=3, null=True, noisy=4
    )
    coverage = table.set_index("estimand")["coverage"]
    assert coverage.drop("any claim").between(0.88, 1.0).all(), table
    assert coverage["any claim"] <= 0.15, table  # 300 experiments measure ~1-3%; 40 leave room


def test_few_false_claims_in_a_whole_transfer_report_under_the_global_null():
    table = _load("report_false_claims").run(experiments=20, seeds=3, noise_sd=0.015, seed_sd=0.01, seed=4, settings=3)
    assert (table["any"] > 0).mean() <= 0.2, table  # 300 experiments measure ~5%; 20 leave room
