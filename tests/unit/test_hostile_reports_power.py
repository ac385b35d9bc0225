"""plan-seeds on hostile input: more than MAX_FACTORS factors is one sentence before any
work (30 factors hung, 13 took 130 s), and the plan itself is cheap: the family contrasts are
built as contrast rows (no 2^k identity), and the smallest seed count is found by bisection on
the monotone power, a dozen power evaluations instead of one per candidate.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_hostile_reports_power_e2e.py."""

from __future__ import annotations

import numpy as np
import pytest

from dapo_ablate.reports import ReportInputError, power
from dapo_ablate.reports import shapley as sv
from dapo_ablate.reports.design import describe_design
from dapo_ablate.reports.effects import effect_contrasts, model_prediction_map


def _power_calls(monkeypatch) -> list:
    calls = []
    original = power.power_at

    def counted(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(power, "power_at", counted)
    return calls


def _identity_families(design, factors):
    """The reference: each family's rows from the statistics applied to the 2^k identity and all
    effects (plan-seeds' first implementation, before contrast rows)."""
    m, k = len(design.observed), design.k
    eye = np.eye(2**k)
    value_map = np.eye(m) if design.kind == "full" else model_prediction_map(design, np.eye(m))
    effects = effect_contrasts(design, factors, np.eye(m))
    return {
        "attribution": sv.shapley_values(eye).T @ value_map,
        "interactions": effects.contrasts[effects.orders == 2],
        "order": (sv.leave_one_out(eye) - sv.add_one(eye)).T @ value_map,
    }


def test_more_than_twelve_factors_is_refused_before_any_work(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the plan started")

    monkeypatch.setattr(power, "family_contrasts", no_work)
    monkeypatch.setattr(power, "describe_design", no_work)
    with pytest.raises(ReportInputError, match=r"plan-seeds got 13 factors.*at most 12.*--factors"):
        power.plan_seeds([f"f{i}" for i in range(13)], sigma=0.015, effect=0.02)


def test_seeds_needed_says_so_when_no_seed_count_reaches_the_power(monkeypatch):
    calls = _power_calls(monkeypatch)
    n, achieved = power.seeds_needed(1e-6, 1.0, np.array([1.0, -1.0, -1.0, 1.0]), 4, 0.001, 0.8)
    assert n == power.MAX_SEEDS + 1 and np.isnan(achieved) and len(calls) == 1


@pytest.mark.parametrize("half", [False, True])
def test_family_contrasts_match_the_identity_construction(half):
    k = 6
    factors = [f"f{i}" for i in range(k)]
    cells = power.half_fraction(k) if half else np.arange(2**k)
    design = describe_design(cells, k)
    families = power.family_contrasts(design, factors)
    for name, rows in _identity_families(design, factors).items():
        np.testing.assert_allclose(families[name][1], rows, atol=1e-12)
