"""reports/compute_curves.py and curve_plots.py: the saturating fit, per-technique effects on the
asymptote and the midpoint with intervals, verdicts, bad input and the figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dapo_ablate.reports.compute_curves import (
    BOTH,
    CEILING,
    NEITHER,
    NOT_ENOUGH,
    SPEED,
    analyze_curves,
    fit_runs,
    saturating_curve,
    verdicts,
)  # fmt: skip
from dapo_ablate.reports.curve_plots import curve_figure
from dapo_ablate.reports.table import ReportInputError

FACTORS = ["a", "b", "c"]
TOKENS = np.concatenate([[0.0], np.geomspace(2e5, 2e7, 8)])


def test_the_curve_by_hand():
    # R0 .2, A .6, C_mid 1e6, B 2: half the gain at C_mid (.4); at 2e6, .2 + .4 / (1 + 1/4) = .52; R(0) = R0
    values = saturating_curve([1e6, 2e6, 0.0], 0.2, 0.6, 1e6, 2.0)
    assert values == pytest.approx([0.4, 0.52, 0.2])


def _curves(rng, seeds=3, asymptote_effect=0.04, log_mid_effect=0.3, noise=0.01, points=TOKENS, steepness=1.5):
    """Curves with planted main effects: a on A, b on log C_mid (as -1/+1 contrasts), c nothing."""
    rng = np.random.default_rng(rng)
    rows = []
    for mask in range(8):
        a, b, c = ((mask >> i) & 1 for i in range(3))
        for seed in range(seeds):
            top = 0.6 + asymptote_effect * (a - 0.5) + rng.normal(0, 0.01)
            mid = np.exp(np.log(3e6) + log_mid_effect * (b - 0.5) + rng.normal(0, 0.05))
            y = saturating_curve(points, 0.2, top, mid, steepness) + rng.normal(0, noise, len(points))
            rows += [{"a": a, "b": b, "c": c, "seed": seed, "step": 10 * i, "avg@32": value, "pass@32": 1.0,
                      "tokens_generated": x, "gpu_hours": x / 1e6, "run_id": f"r{mask}-{seed}"}
                     for i, (x, value) in enumerate(zip(points, y))]  # fmt: skip
    return pd.DataFrame(rows)


def test_a_noiseless_run_gives_back_its_parameters():
    y = saturating_curve(TOKENS, 0.25, 0.7, 3e6, 1.5)
    table = pd.concat(
        [pd.DataFrame({"a": mask & 1, "b": mask >> 1 & 1, "c": mask >> 2 & 1, "seed": 0, "step": range(len(TOKENS)),
                       "avg@32": y, "tokens_generated": TOKENS}) for mask in range(8)]
    )  # fmt: skip
    runs, steepness = fit_runs(table, FACTORS)
    assert len(runs) == 8
    row = runs.iloc[5]
    assert steepness == pytest.approx(1.5, rel=0.01)
    assert row["asymptote"] == pytest.approx(0.7, abs=2e-3)
    assert row["r0"] == pytest.approx(0.25, abs=2e-3)
    assert row["midpoint"] == pytest.approx(3e6, rel=0.02)
    assert row["fitted"] and not row["at_edge"]


def test_planted_effects_are_recovered_within_their_intervals():
    result = analyze_curves(_curves(0), FACTORS)
    effects = result.effects.set_index("term")
    a, b = effects.loc["a"], effects.loc["b"]
    assert a["asymptote_ci_low"] < 0.04 < a["asymptote_ci_high"]
    assert b["midpoint_ci_low"] < 0.3 < b["midpoint_ci_high"]
    assert b["midpoint_ratio"] == pytest.approx(np.exp(b["midpoint_log_effect"]))
    assert list(effects["verdict"]) == [CEILING, SPEED, NEITHER]
    # the final metric's effect is reported beside them: a raises the end of every curve
    assert a["final_ci_low"] > 0
    assert result.steepness == pytest.approx(1.5, rel=0.15)
    assert set(result.cells["runs"]) == {3} and result.cells["asymptote"].notna().all()


def test_gpu_hours_as_the_compute_axis_moves_only_the_midpoint_scale():
    table = _curves(1)
    by_tokens = analyze_curves(table, FACTORS).effects.set_index("term")
    by_hours = analyze_curves(table, FACTORS, compute="gpu_hours").effects.set_index("term")
    # gpu_hours = tokens / 1e6: the same curves, C_mid / 1e6, so effects on log C_mid and A agree
    assert by_hours["midpoint_log_effect"].to_numpy() == pytest.approx(by_tokens["midpoint_log_effect"], abs=1e-3)
    assert by_hours["asymptote_effect"].to_numpy() == pytest.approx(by_tokens["asymptote_effect"], abs=1e-4)


def test_verdicts_by_hand():
    # p_A = (.001, .30, .01, .5), p_C = (.40, .004, .02, .5): Holm over 8 -> .008, 1, .06, 1 and
    # 1, .028, .12, 1 (sorted .001 .004 .01 .02 .30 .40 .5 .5 times 8..1 = .008 .028 .06 .10 ...)
    labels, adj_a, adj_c = verdicts(np.array([0.001, 0.30, 0.01, 0.5]), np.array([0.40, 0.004, 0.02, 0.5]), 0.05)
    assert adj_a[:3] == pytest.approx([0.008, 1.0, 0.06]) and adj_c[1] == pytest.approx(0.028)
    assert labels == [CEILING, SPEED, NEITHER, NEITHER]
    both, _, _ = verdicts(np.array([0.001, np.nan]), np.array([0.001, 0.01]), 0.05)
    assert both == [BOTH, NOT_ENOUGH]


def test_runs_with_three_evaluations_are_not_enough_data():
    table = _curves(2, points=np.array([0.0, 1e6, 2e6]))  # the built-in task's steps 0, 10, 20
    result = analyze_curves(table, FACTORS)
    assert not result.runs["fitted"].any()
    assert set(result.effects["verdict"]) == {NOT_ENOUGH}
    assert result.effects["final_effect"].notna().all()  # the final metric still has its effects
    assert any("fewer than 4 evaluations" in note for note in result.notes)


def test_bad_curve_tables_are_one_sentence():
    table = _curves(3)
    with pytest.raises(ReportInputError, match="lacks column 'tokens_generated'"):
        analyze_curves(table.drop(columns=["tokens_generated"]), FACTORS)
    with pytest.raises(ReportInputError, match="'tokens_generated'.*negative"):
        analyze_curves(table.assign(tokens_generated=-table["tokens_generated"]), FACTORS)
    with pytest.raises(ReportInputError, match="lacks column 'c'"):
        analyze_curves(table.drop(columns=["c"]), FACTORS)


def test_the_figure_is_written(tmp_path):
    table = _curves(4)
    result = analyze_curves(table, FACTORS)
    path = curve_figure(result, table, FACTORS, tmp_path / "compute_curves.png", "avg@32")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_figure_fits_the_evaluations_and_says_when_nothing_could_be_fitted():
    import matplotlib.pyplot as plt

    from dapo_ablate.reports.curve_plots import curve_axes

    table = _curves(4)
    figure = curve_axes(analyze_curves(table, FACTORS), table, FACTORS, "avg@32", True)
    (axis, *_) = figure.axes
    low, high = axis.get_ylim()
    assert 0 <= low <= 100 * table["avg@32"].min() and 100 * table["avg@32"].max() <= high <= 100  # pp, inside 0-100
    assert axis.get_xscale() == "log" and axis.get_ylabel() == "avg@32 (pp)" and "B = " in axis.get_title()
    plt.close(figure)
    three = table[table["step"] < 30]  # 3 evaluations per run: too few for any fit
    figure = curve_axes(analyze_curves(three, FACTORS), three, FACTORS, "avg@32", True)
    assert "evaluations only" in figure.axes[0].get_title()
    assert all("not fitted" in text.get_text() for text in figure.axes[0].get_legend().get_texts())
    plt.close(figure)


def test_a_factor_named_like_tex_math_is_drawn_as_written():
    """compute_curves.png renders like every report figure: a name such as $\\foo$ is text, not math."""
    from dapo_ablate.reports.curve_plots import curve_png

    table = _curves(4).rename(columns={"a": "$\\foo$"})
    factors = ["$\\foo$", "b", "c"]
    assert curve_png(analyze_curves(table, factors), table, factors, "avg@32", True)[:8] == b"\x89PNG\r\n\x1a\n"


def test_curves_that_have_not_bent_within_the_data_get_not_enough_data():
    """Midpoints far beyond the compute observed (the curves still rise at the last evaluation): A and
    C_mid trade off, so no technique is said to move the ceiling or the speed, or neither."""
    far = _curves(0, points=np.concatenate([[0.0], np.geomspace(2e4, 2e6, 8)]))  # C_mid 3e6: past the last evaluation
    result = analyze_curves(far, FACTORS)
    assert set(result.effects["verdict"]) == {NOT_ENOUGH}
    assert any("have not bent toward a ceiling" in note for note in result.notes)


def test_an_interval_that_says_nothing_is_not_enough_data_not_neither():
    noisy = _curves(1, seeds=2, noise=0.2)  # evaluations drowned in noise: the fits' intervals span everything
    effects = analyze_curves(noisy, FACTORS).effects
    wide = (effects["asymptote_ci_high"] - effects["asymptote_ci_low"] > 0.5) | (
        effects["midpoint_ci_high"] - effects["midpoint_ci_low"] > np.log(100))
    assert wide.any()
    assert set(effects.loc[wide, "verdict"]) == {NOT_ENOUGH}


def test_the_report_shows_one_interval_for_the_final_metric(tmp_path):
    """compute_curves.csv's final-metric effect is the effects table's main effect, interval and all."""
    from dapo_ablate.reports import write_report

    curves = _curves(2)
    last = curves.sort_values("step").groupby("run_id").tail(1)
    results = last[["a", "b", "c", "seed", "avg@32", "tokens_generated"]].assign(tokens_discarded=0.0, wall_s=1.0)
    write_report(results, FACTORS, tmp_path, curves=curves, formats=["csv"])
    effects = pd.read_csv(tmp_path / "effects.csv").set_index("term")
    curve = pd.read_csv(tmp_path / "compute_curves.csv").set_index("term")
    for term in FACTORS:
        assert curve.loc[term, "final_effect"] == pytest.approx(effects.loc[term, "effect"])
        assert (curve.loc[term, "final_ci_low"], curve.loc[term, "final_ci_high"]) == pytest.approx(
            (effects.loc[term, "ci_low"], effects.loc[term, "ci_high"]))


def _half_bent(rng=5, seeds=2) -> pd.DataFrame:
    """Cells with b off bend within their data (C_mid 3e6; the evaluations reach 2e7); cells with b on
    are still rising at their last evaluation (C_mid 1e8, five times past it)."""
    rng = np.random.default_rng(rng)
    rows = []
    for mask in range(8):
        a, b, c = ((mask >> i) & 1 for i in range(3))
        for seed in range(seeds):
            y = saturating_curve(TOKENS, 0.2, 0.6, 1e8 if b else 3e6, 1.5) + rng.normal(0, 0.005, len(TOKENS))
            rows += [{"a": a, "b": b, "c": c, "seed": seed, "step": 10 * i, "avg@32": value, "tokens_generated": x,
                      "run_id": f"r{mask}-{seed}"} for i, (x, value) in enumerate(zip(TOKENS, y))]  # fmt: skip
    return pd.DataFrame(rows)
