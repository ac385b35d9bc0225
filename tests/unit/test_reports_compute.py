"""The equal-compute view reads every run inside its own curve: a run whose first evaluation
already generated more tokens than the budget is "not reached" (left out and counted), never
given its first evaluation's value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dapo_ablate.reports import analyze
from dapo_ablate.reports.compute import budget_values
from dapo_ablate.reports.simulate import simulate_results


FACTORS = ["a", "b"]


def _curves(results: pd.DataFrame, late: int | None = None) -> pd.DataFrame:
    """Evaluations at 1/4 .. 4/4 of each run's tokens, the metric rising linearly to its final
    value; run ``late`` evaluates first at 3/4 of a total 10x everyone else's."""
    rows = []
    for i, run in results.iterrows():
        scale = 10.0 if i == late else 1.0
        for quarter in ((3, 4) if i == late else (1, 2, 3, 4)):
            rows.append({**run[[*FACTORS, "seed"]].to_dict(), "step": quarter,
                         "tokens_generated": scale * run["tokens_generated"] * quarter / 4,
                         "avg@32": run["avg@32"] * quarter / 4})  # fmt: skip
    return pd.DataFrame(rows)


def test_budget_reads_inside_each_curve_and_counts_runs_not_reached():
    results = simulate_results(FACTORS, 0.3, {("a",): 0.1}, seeds=3, rng=0)
    at, budget, not_reached = budget_values(_curves(results), results, FACTORS, "avg@32")
    assert not_reached == 0 and budget == results["tokens_generated"].min()
    # budget = the smallest total (cell 00: 10M); a run of 11M is read at 10/11 of its way: linear between
    # its evaluations at 8.25M (3/4) and 11M (4/4)
    run = results.index[results["tokens_generated"] == 11e6][0]
    expected = np.interp(10e6, [8.25e6, 11e6], [0.75 * results.at[run, "avg@32"], results.at[run, "avg@32"]])
    assert at.at[run, "avg@32"] == pytest.approx(expected)
    late = int(results.index[results["tokens_generated"] == 12e6][0])  # first evaluation at 10 x 12M x 3/4 = 90M
    at, budget, not_reached = budget_values(_curves(results, late), results, FACTORS, "avg@32")
    assert not_reached == 1 and len(at) == len(results) - 1 and budget == 10e6
    kept = results.drop(index=late)[[*FACTORS, "seed"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(at[[*FACTORS, "seed"]], kept)  # left out, not clamped to its first value


def test_report_says_how_many_runs_did_not_reach_the_budget():
    results = simulate_results(FACTORS, 0.3, {("a",): 0.1}, seeds=3, rng=1)
    late = int(results.index[results["tokens_generated"] == 12e6][0])
    analysis = analyze(results, FACTORS, curves=_curves(results, late))
    note = next(n for n in analysis.notes if n.startswith("Equal compute"))
    assert "1 run had generated more than that by its first evaluation: not reached" in note
    compute = analysis.compute.set_index("cell")
    assert compute["runs_at_budget"].sum() == len(results) - 1 and compute["runs_at_budget"].min() == 2
    assert analysis.compute_matched["effect_at_budget"].notna().all()
