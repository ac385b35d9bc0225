"""plan-seeds on hostile input (issue 23): more than MAX_FACTORS factors is one sentence before any
work (30 factors hung, 13 took 130 s), and the plan itself is cheap: the family contrasts are
built as contrast rows (no 2^k identity), and the smallest seed count is found by bisection on
the monotone power, a dozen power evaluations instead of one per candidate."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dapo_ablate.reports import ReportInputError, power
from dapo_ablate.reports import shapley as sv
from dapo_ablate.reports.design import describe_design
from dapo_ablate.reports.effects import effect_contrasts, model_prediction_map


def test_more_than_twelve_factors_is_refused_before_any_work(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the plan started")

    monkeypatch.setattr(power, "family_contrasts", no_work)
    monkeypatch.setattr(power, "describe_design", no_work)
    with pytest.raises(ReportInputError, match=r"plan-seeds got 13 factors.*at most 12.*--factors"):
        power.plan_seeds([f"f{i}" for i in range(13)], sigma=0.015, effect=0.02)


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


def test_thirty_factors_are_refused_not_planned():
    """In a subprocess with 3 GiB of address space and a generous timeout: 2^30 cells would
    need far more (and hung before issue 23); the refusal needs none of it."""
    done = subprocess.run([sys.executable, "-c", THIRTY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("REFUSED: plan-seeds got 30 factors"), done.stdout


def _power_calls(monkeypatch) -> list:
    calls = []
    original = power.power_at

    def counted(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(power, "power_at", counted)
    return calls


def _linear_scan(effect, sigma, contrast, m, level, wanted):
    """The reference: every n from 2 up (the code before issue 23)."""
    unit = float(np.sum(np.asarray(contrast) ** 2))
    for n in range(2, power.MAX_SEEDS + 1):
        achieved = power.power_at(effect, sigma * np.sqrt(unit / n), power.welch_df(contrast, m, n), level)
        if achieved >= wanted:
            return n, achieved
    return power.MAX_SEEDS + 1, float("nan")


@pytest.mark.parametrize(("effect", "sigma"), [(0.02, 0.015), (0.02, 0.03), (0.05, 0.01)])
def test_seeds_needed_bisects_and_matches_the_linear_scan(monkeypatch, effect, sigma):
    contrast = np.array([1.0, -1.0, -1.0, 1.0] + [0.0] * 28)  # an order gap of the 2^5: 4 cells
    expected = _linear_scan(effect, sigma, contrast, 32, 0.05 / 15, 0.8)
    calls = _power_calls(monkeypatch)
    n, achieved = power.seeds_needed(effect, sigma, contrast, 32, 0.05 / 15, 0.8)
    assert n == expected[0] and (achieved == pytest.approx(expected[1]) or np.isnan(expected[1]))
    assert len(calls) <= 2 + int(np.ceil(np.log2(power.MAX_SEEDS)))


def test_seeds_needed_says_so_when_no_seed_count_reaches_the_power(monkeypatch):
    calls = _power_calls(monkeypatch)
    n, achieved = power.seeds_needed(1e-6, 1.0, np.array([1.0, -1.0, -1.0, 1.0]), 4, 0.001, 0.8)
    assert n == power.MAX_SEEDS + 1 and np.isnan(achieved) and len(calls) == 1


def _identity_families(design, factors):
    """The reference: each family's rows from the statistics applied to the 2^k identity and all
    effects (the code before issue 23)."""
    m, k = len(design.observed), design.k
    eye = np.eye(2**k)
    value_map = np.eye(m) if design.kind == "full" else model_prediction_map(design, np.eye(m))
    effects = effect_contrasts(design, factors, np.eye(m))
    return {
        "attribution": sv.shapley_values(eye).T @ value_map,
        "interactions": effects.contrasts[effects.orders == 2],
        "order": (sv.leave_one_out(eye) - sv.add_one(eye)).T @ value_map,
    }


@pytest.mark.parametrize("half", [False, True])
def test_family_contrasts_match_the_identity_construction(half):
    k = 6
    factors = [f"f{i}" for i in range(k)]
    cells = power.half_fraction(k) if half else np.arange(2**k)
    design = describe_design(cells, k)
    families = power.family_contrasts(design, factors)
    for name, rows in _identity_families(design, factors).items():
        np.testing.assert_allclose(families[name][1], rows, atol=1e-12)


def test_twelve_factors_plan_in_both_designs():
    table = power.plan_seeds([f"f{i}" for i in range(12)], sigma=0.015, effect=0.02)
    assert list(table["cells"].unique()) == [4096, 2048]
    assert (table["power"] >= 0.8).all()
