"""Every method line says what was computed: each line is read against the numbers the analysis
used (intervals.csv's df, the noise source, the adjustment each family got)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports.analysis import analyze
from dapo_ablate.reports.claims import interval, short_term
from dapo_ablate.reports.pages import table_captions
from dapo_ablate.reports.simulate import simulate_results
from dapo_ablate.reports.summary import summary_sections

THREE = list(PAPER_FACTORS[:3])


def test_with_seeds_the_interval_line_names_the_df_the_intervals_use():
    results = simulate_results(THREE, 0.3, {(THREE[0],): 0.05}, seeds=2, noise_sd=0.02, rng=4)
    analysis = analyze(results, THREE)
    df = pd.to_numeric(analysis.intervals["df"]).dropna()
    stated = re.search(r"Welch-Satterthwaite df \(here from ([\d.]+) to ([\d.]+);", analysis.ci_method)
    assert stated, analysis.ci_method
    assert (float(stated.group(1)), float(stated.group(2))) == (round(df.min(), 1), round(df.max(), 1))
    assert "residual df)" not in analysis.ci_method  # the pooled df is no interval's
    assert "its own SE and Welch-Satterthwaite df" in analysis.effects_method
    assert "same model and df" not in analysis.effects_method
    assert "each effect's Welch-Satterthwaite df" in table_captions(analysis)["effects"]


def test_a_not_supported_interval_that_excludes_zero_is_called_unadjusted():
    """A statistic whose own 95% interval excludes zero but whose family-adjusted test does not pass
    is listed under "Not supported" with that interval named as the unadjusted one (beside "not
    distinguishable from zero", an interval past zero would otherwise read as a contradiction)."""
    results = simulate_results(THREE, 0.3, {(THREE[0],): 0.09}, seeds=2, noise_sd=0.02, rng=4)
    analysis = analyze(results, THREE)
    tests = analysis.tests
    open_rows = tests[tests["family"].isin(["attribution", "steps"]) & ~tests["claimed"] & tests["p_value"].notna()]
    past_zero = open_rows[(open_rows["ci_low"] > 0) | (open_rows["ci_high"] < 0)]
    assert len(past_zero), "the data must give a not-supported statistic whose unadjusted interval excludes zero"
    assert (past_zero["p_adjusted"] >= analysis.options.alpha).all()
    lines = summary_sections(analysis)["Not supported by the data"]
    for row in open_rows.itertuples(index=False):
        mine = [line for line in lines if line.startswith(f"{short_term(row.term)}: ")]
        assert len(mine) == 1, (row.term, lines)
        shown = f"{interval(row.ci_low, row.ci_high, analysis.percent)} (unadjusted CI; adjusted p = {row.p_adjusted:.2g})"
        assert shown in mine[0] and "not distinguishable from zero" in mine[0], mine[0]


def test_with_one_seed_every_line_names_lenths_df_and_margin():
    factors = list(PAPER_FACTORS)
    results = simulate_results(factors, 0.3, {(factors[4],): 0.08}, seeds=1, noise_sd=0.01, rng=2)
    analysis = analyze(results, factors)
    lenth = analysis.lenth
    assert lenth is not None
    df = pd.to_numeric(analysis.intervals["df"]).dropna().unique()
    assert np.allclose(df, lenth["d"])  # every interval uses Lenth's df
    assert f"Lenth's df ({lenth['d']:.1f}) for every effect" in analysis.effects_method
    assert "Lenth's df (one run per cell)" in table_captions(analysis)["effects"]
    assert "Welch-Satterthwaite" not in table_captions(analysis)["effects"]
    method = " ".join(summary_sections(analysis)["Method"])
    tests = analysis.tests
    effect_families = {family for family, rows in tests.groupby("family") if family in ("attribution", "interactions")
                       and rows["kind"].isin(["main", "interaction"]).all()}  # Shapley values keep Holm
    assert set(analysis.guarantee.simultaneous) == effect_families == {"interactions"}
    assert f"Lenth's simultaneous margin over the {lenth['m']} effects" in method


def test_the_adjustment_line_names_no_simultaneous_margin_with_seeds():
    results = simulate_results(THREE, 0.3, {}, seeds=3, noise_sd=0.02, rng=1)
    analysis = analyze(results, THREE)
    assert analysis.guarantee.simultaneous == ()
    assert "simultaneous margin" not in analysis.guarantee.sentence()
