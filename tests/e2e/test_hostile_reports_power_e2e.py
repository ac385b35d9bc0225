"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_hostile_reports_power.py
describes; its docstring says what they check."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dapo_ablate.reports import power

from support import HANG_GUARD_S
from test_hostile_reports_power import _power_calls  # noqa: F401, F811 - shared with the fast part

THIRTY = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
from dapo_ablate.reports import ReportInputError
from dapo_ablate.reports.power import plan_seeds
try:
    plan_seeds([f"f{i}" for i in range(30)], sigma=0.015, effect=0.02)
except ReportInputError as error:
    print("REFUSED:", error)
"""


def _linear_scan(effect, sigma, contrast, m, level, wanted):
    """The reference: every n from 2 up (plan-seeds' first implementation, before bisection)."""
    unit = float(np.sum(np.asarray(contrast) ** 2))
    for n in range(2, power.MAX_SEEDS + 1):
        achieved = power.power_at(effect, sigma * np.sqrt(unit / n), power.welch_df(contrast, m, n), level)
        if achieved >= wanted:
            return n, achieved
    return power.MAX_SEEDS + 1, float("nan")


def test_thirty_factors_are_refused_not_planned():
    """In a subprocess with 3 GiB of address space and a generous timeout: 2^30 cells would
    need far more (and hung before the refusal); the refusal needs none of it."""
    done = subprocess.run([sys.executable, "-c", THIRTY], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("REFUSED: plan-seeds got 30 factors"), done.stdout


@pytest.mark.parametrize(("effect", "sigma"), [(0.02, 0.015), (0.02, 0.03), (0.05, 0.01)])
def test_seeds_needed_bisects_and_matches_the_linear_scan(monkeypatch, effect, sigma):
    contrast = np.array([1.0, -1.0, -1.0, 1.0] + [0.0] * 28)  # an order gap of the 2^5: 4 cells
    expected = _linear_scan(effect, sigma, contrast, 32, 0.05 / 15, 0.8)
    calls = _power_calls(monkeypatch)
    n, achieved = power.seeds_needed(effect, sigma, contrast, 32, 0.05 / 15, 0.8)
    assert n == expected[0] and (achieved == pytest.approx(expected[1]) or np.isnan(expected[1]))
    assert len(calls) <= 2 + int(np.ceil(np.log2(power.MAX_SEEDS)))


def test_twelve_factors_plan_in_both_designs():
    table = power.plan_seeds([f"f{i}" for i in range(12)], sigma=0.015, effect=0.02)
    assert list(table["cells"].unique()) == [4096, 2048]
    assert (table["power"] >= 0.8).all()
