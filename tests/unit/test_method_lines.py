"""Every method line says what was computed: each line is read against the numbers the analysis
used (intervals.csv's df, the noise source, the adjustment each family got)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports.analysis import analyze
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
    for line in summary_sections(analysis)["Not supported by the data"]:
        if " [" in line and "adjusted p" in line:
            assert "unadjusted CI" in line, line  # the interval beside "not distinguishable" is the unadjusted one


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
