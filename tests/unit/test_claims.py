"""Claims: multiplicity adjustments by hand, claims.csv as the source of the summary, designs the
report can defend (resolution IV fractions, one-at-a-time paths) and Lenth's SME with one seed."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dapo_ablate.reports import PAPER_FACTORS, ReportInputError, analyze, write_report
from dapo_ablate.reports.claims import CLAIM_COLUMNS
from dapo_ablate.reports.design import contrast_column
from dapo_ablate.reports.multiplicity import (
    benjamini_hochberg,
    holm,
    lenth_bar,
    lenth_margins,
    sidak,
)
from dapo_ablate.reports.simulate import simulate_results
from dapo_ablate.reports.summary import summary_sections

FACTORS = list(PAPER_FACTORS)
OF, CH, SP, TL, DS = FACTORS
RES_IV = [m for m in range(32) if bin(m & 15).count("1") % 2 == 0]  # I = OF:CH:SP:TL, DS free


def test_holm_and_bh_by_hand():
    # p = (.01, .04, .03). Holm: sorted .01, .03, .04 times 3, 2, 1 = .03, .06, .04, running max
    # .03, .06, .06 -> (.03, .06, .06). BH: times 3/1, 3/2, 3/3 = .03, .045, .04, running min from
    # the top .03, .04, .04 -> (.03, .04, .04). NaN is not a test.
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.04, 0.03]), [0.03, 0.04, 0.04])
    np.testing.assert_allclose(holm([0.02, np.nan]), [0.02, np.nan])
    # Sidak over m = 2: 1 - (1 - .05)^2 = .0975
    assert sidak(np.array([0.05]), 2)[0] == pytest.approx(0.0975)


def test_lenth_bar_by_hand():
    # m = 15, d = 5, alpha .05 split over F = 3 families: p* = 1 - (1 - .05/3)^(1/15) = .001120,
    # bar = t(1 - p*/2, 5) PSE = 6.70 PSE; with F = 1 it is the SME, 5.22 PSE
    assert lenth_bar(1.0, 5, 15, 0.05, 3) == pytest.approx(stats.t.ppf(1 - 0.0011198 / 2, 5), rel=1e-4)
    assert lenth_bar(1.0, 5, 15, 0.05, 3) == pytest.approx(6.70, abs=0.01)
    assert lenth_bar(1.0, 5, 15, 0.05, 1) == pytest.approx(lenth_margins(1.0, 15, 0.05)[1])


def test_lenth_margins_by_hand():
    # Lenth (1989), m = 15 effects: d = 5; ME = t(.975, 5) PSE = 2.571 PSE;
    # gamma = (1 + .95^(1/15)) / 2 = .99829, SME = t(gamma, 5) PSE = 5.22 PSE
    me, sme, d = lenth_margins(1.0, 15, 0.05)
    assert d == 5 and me == pytest.approx(2.5706, abs=1e-4) and sme == pytest.approx(5.22, abs=0.01)


@pytest.fixture(scope="module")
def planted():
    planted = {(OF,): 0.06, (DS,): 0.08, (CH, DS): 0.03}
    return simulate_results(FACTORS, 0.30, planted, seeds=3, noise_sd=0.015, seed_sd=0.01, rng=21)


def test_claims_are_the_adjusted_tests_below_alpha(planted):
    analysis = analyze(planted, FACTORS)
    tests, claims = analysis.tests, analysis.claims
    assert list(claims.columns) == CLAIM_COLUMNS
    assert set(tests["family"]) == {"attribution", "interactions", "order"}
    assert (claims["p_adjusted"] < 0.05).all() and (claims["p_adjusted"] >= claims["p_value"]).all()
    assert ((claims["ci_low"] > 0) | (claims["ci_high"] < 0)).all()  # every claimed interval excludes 0
    # Holm within the 5 Shapley values, times the 3 families
    shapley = tests[tests["family"] == "attribution"]
    np.testing.assert_allclose(shapley["p_adjusted"], np.minimum(3 * holm(shapley["p_value"]), 1))
    assert {(r.kind, r.term) for r in claims.itertuples()} >= {("shapley", OF), ("shapley", DS), ("interaction", f"{CH}:{DS}")}


def test_adjust_options_order_the_p_values(planted):
    holm_tests = analyze(planted, FACTORS).tests
    bh_tests = analyze(planted, FACTORS, adjust="bh").tests
    raw = analyze(planted, FACTORS, adjust="none").tests
    np.testing.assert_allclose(raw["p_adjusted"], raw["p_value"])
    assert (bh_tests["p_adjusted"] <= holm_tests["p_adjusted"] + 1e-15).all()


def test_effects_csv_gains_df_and_p_adjusted(planted):
    effects = analyze(planted, FACTORS).effects
    assert list(effects.columns) == ["term", "effect", "se", "ci_low", "ci_high", "p_value", "df", "p_adjusted"]
    assert effects["df"].between(2, 62).all() and (effects["p_adjusted"] >= effects["p_value"]).all()


def test_no_claims_renders_no_bullet(tmp_path):
    null = simulate_results(FACTORS, 0.30, {}, seeds=3, noise_sd=0.015, rng=3)
    write_report(null, FACTORS, tmp_path, formats=["md"])
    assert pd.read_csv(tmp_path / "claims.csv").empty
    section = (tmp_path / "report.md").read_text().split("## Supported by the data")[1].split("## ")[0]
    assert not [line for line in section.splitlines() if line.startswith("- ")]


@pytest.fixture(scope="module")
def res_iv():
    # the real driver is SP:TL, aliased with OF:CH in this fraction
    return simulate_results(FACTORS, 0.30, {(OF,): 0.05, (SP, TL): 0.05}, seeds=3, noise_sd=0.01, cells=RES_IV, rng=22)


def test_resolution_iv_fraction_warns_lists_every_chain_and_names_whole_chains(res_iv):
    analysis = analyze(res_iv, FACTORS)
    assert analysis.design.kind == "fraction" and analysis.design.resolution == 4
    design_lines = summary_sections(analysis)["Design"]
    assert "WARNING: resolution IV is below V" in design_lines[1]
    cells = np.array(RES_IV)
    # every alias chain holding a main effect or a 2FI, found independently from the contrast columns
    terms = [t for order in range(1, 6) for t in __import__("itertools").combinations(range(5), order)]
    columns = {t: contrast_column(cells, t) for t in terms}
    chains = {}
    for t in terms:
        key = tuple(columns[t] * columns[t][0])
        chains.setdefault(key, []).append(":".join(FACTORS[i] for i in t))
    expected = [c for c in chains.values() if len(c) > 1 and min(m.count(":") for m in c) <= 1]
    printed = [line.strip() for line in design_lines[2:]]
    assert len(printed) == len(expected) == 12
    for chain in expected:
        assert " = ".join(chain) in printed
    interactions = analysis.claims[analysis.claims["kind"] == "interaction"]
    assert f"{OF}:{CH} = {SP}:{TL}" in set(interactions["term"])
    for term in interactions["term"]:  # never one member of a chain alone
        members = set(term.split(" = "))
        assert any(members == set(chain) for chain in chains.values()), term
    assert not analysis.tests["kind"].isin(["shapley", "order"]).any()
    assert analysis.shapley["shapley"].isna().all()


def test_declared_fraction_v_refuses_a_resolution_iv_fraction(res_iv):
    with pytest.raises(ReportInputError, match=r"resolution IV fraction.*--design fraction"):
        analyze(res_iv, FACTORS, design="fraction-V")
    assert analyze(res_iv, FACTORS, design="fraction").design.resolution == 4
    with pytest.raises(ReportInputError, match="--design 'half-ish' is not one of"):
        analyze(res_iv, FACTORS, design="half-ish")


def test_one_at_a_time_path_reports_path_gains_not_main_effects(tmp_path):
    path = [0, 1, 3, 7, 15, 31]
    results = simulate_results(FACTORS, 0.30, {(OF,): 0.06, (DS,): 0.08}, seeds=3, noise_sd=0.01, cells=path, rng=23)
    analysis = analyze(results, FACTORS)
    assert analysis.effects.empty
    assert set(analysis.tests["kind"]) == {"step"} and set(analysis.tests["family"]) == {"steps"}
    assert list(analysis.tests["term"]) == [
        "GRPO -> OF", "OF -> OF+CH", "OF+CH -> OF+CH+SP", "OF+CH+SP -> OF+CH+SP+TL", "OF+CH+SP+TL -> OF+CH+SP+TL+DS",
    ]  # fmt: skip
    steps = analysis.cumulative.iloc[1:]
    np.testing.assert_allclose(analysis.tests["estimate"], steps["delta"])
    np.testing.assert_allclose(analysis.tests["ci_low"], steps["delta_ci_low"])
    write_report(results, FACTORS, tmp_path, formats=["md"])
    text = (tmp_path / "report.md").read_text()
    supported = text.split("## Supported by the data")[1].split("## ")[0]
    assert "Path gain GRPO -> OF" in supported and "main effect" not in supported
    assert "## Factorial effects" in text and "_Not computed._" in text.split("## Factorial effects")[1].split("## ")[0]


def test_one_seed_claims_exactly_the_effects_past_the_printed_bar():
    """The bar the summary prints is the bar the claims use: Lenth's simultaneous margin at the
    family's share alpha / F (here F = 3), not the SME at alpha. Fails if they differ."""
    planted = {(OF,): 0.06, (DS,): 0.08, (CH, DS): 0.03, (OF, SP): 0.012, (CH, TL): 0.011}
    results = simulate_results(FACTORS, 0.30, planted, seeds=1, noise_sd=0.004, rng=29)
    analysis = analyze(results, FACTORS)
    lenth = analysis.lenth
    assert lenth["m"] == 31 and lenth["d"] == pytest.approx(31 / 3)
    interactions = analysis.tests[analysis.tests["family"] == "interactions"]
    # the rule in p-value form: Sidak over all 31 effects, times the 3 families
    np.testing.assert_allclose(interactions["p_adjusted"], np.minimum(3 * sidak(interactions["p_value"], 31), 1))
    assert lenth["bar"] == pytest.approx(lenth_bar(lenth["pse"], 31 / 3, 31, 0.05, 3)) and lenth["bar"] > lenth["sme"]
    summary = " ".join(summary_sections(analysis)["Not supported by the data"])
    printed = float(re.search(r"an effect is claimed only past ([\d.]+) pp", summary).group(1)) / 100
    assert printed == pytest.approx(lenth["bar"], abs=5e-4)  # printed to 0.1 pp
    effects = analysis.effects.set_index("term")
    claimed = set(analysis.claims.loc[analysis.claims["kind"] == "interaction", "term"])
    sizes = effects.loc[interactions["term"], "effect"].abs()
    assert claimed == set(sizes[sizes > lenth["bar"]].index)  # exactly the effects past the bar
    assert f"{CH}:{DS}" in claimed and f"{OF}:{SP}" not in claimed
    assert ((sizes > lenth["sme"]) & (sizes < lenth["bar"])).any()  # an effect the old label would have passed
    # --per-effect-tests --adjust none: each effect against ME alone, and the summary says so
    raw = analyze(results, FACTORS, per_effect_tests=True, adjust="none")
    assert raw.lenth["bar"] == pytest.approx(raw.lenth["me"])
    raw_claimed = set(raw.claims.loc[raw.claims["kind"] == "interaction", "term"])
    assert raw_claimed == set(sizes[sizes > raw.lenth["me"]].index) and f"{OF}:{SP}" in raw_claimed
    per_effect = analyze(results, FACTORS, per_effect_tests=True).tests
    per_effect = per_effect[per_effect["family"] == "interactions"]
    np.testing.assert_allclose(per_effect["p_adjusted"], np.minimum(3 * holm(per_effect["p_value"]), 1))
    # the SE of every effect is the PSE, with m / 3 df
    np.testing.assert_allclose(effects["se"], lenth["pse"])
    t = effects["effect"] / effects["se"]
    np.testing.assert_allclose(effects["p_value"], 2 * stats.t.sf(np.abs(t), 31 / 3))


def test_method_line_names_the_guarantee_that_was_computed(planted):
    """Holm: family-wise error rate over the list; BH: false discovery rate; none: no guarantee."""
    line = lambda adjust: summary_sections(analyze(planted, FACTORS, adjust=adjust))["Method"][-1]  # noqa: E731
    holm_line, bh_line, none_line = line("holm"), line("bh"), line("none")
    assert "family-wise error rate of the whole claims list is at most 5%" in holm_line
    assert "false discovery rate of the whole claims list is at most 5%" in bh_line and "family-wise" not in bh_line
    assert "no error guarantee" in none_line
