"""Report statistics: hand-computed formulas, and planted effects recovered from simulated factorials."""

from __future__ import annotations

import warnings
from itertools import permutations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dapo_ablate.reports import PAPER_FACTORS, ReportInputError, analyze, validate_results
from dapo_ablate.reports.compute import gain_per_added_mtok
from dapo_ablate.reports.design import all_terms, contrast_column, defining_relation, describe_design, term_name, two_factor_chains
from dapo_ablate.reports.effects import lenth_pse
from dapo_ablate.reports.orderings import cumulative_means, path_masks, position_summary
from dapo_ablate.reports.shapley import add_one, banzhaf_values, leave_one_out, shapley_values
from dapo_ablate.reports.simulate import simulate_results, true_cell_means, wilson_interval
from dapo_ablate.reports.table import cell_label, infer_factors


FACTORS = list(PAPER_FACTORS)
OF, CH, SP, TL, DS = FACTORS
PLANTED = {
    (OF,): 0.06,
    (CH,): 0.02,
    (SP,): 0.03,
    (TL,): 0.01,
    (DS,): 0.08,
    (CH, DS): 0.03,
    (OF, SP): -0.02,
    (OF, CH, DS): 0.04,  # three-factor: makes Shapley and Banzhaf differ
}
HALF_FRACTION = [m for m in range(32) if bin(m).count("1") % 2 == 0]  # I = ABCDE, i.e. E = ABCD


def test_shapley_and_banzhaf_two_factors_by_hand():
    # v(none)=0, v(a)=2, v(b)=3, v(ab)=9
    # Shapley a = (2-0)/2 + (9-3)/2 = 4; b = (3-0)/2 + (9-2)/2 = 5; 4 + 5 = 9 - 0
    # Banzhaf: same for k = 2 (each edge weighs 1/2)
    values = np.array([0.0, 2.0, 3.0, 9.0])
    np.testing.assert_allclose(shapley_values(values), [4.0, 5.0])
    np.testing.assert_allclose(banzhaf_values(values), [4.0, 5.0])


def test_shapley_differs_from_banzhaf_for_a_three_factor_interaction():
    # unanimity game on 3 factors: v = 1 only when all three are on.
    # Shapley: each factor is last in 2 of 6 orderings -> 1/3. Banzhaf: 1 of 4 edges -> 1/4.
    values = np.zeros(8)
    values[7] = 1.0
    np.testing.assert_allclose(shapley_values(values), [1 / 3] * 3)
    np.testing.assert_allclose(banzhaf_values(values), [1 / 4] * 3)


def test_leave_one_out_and_add_one_by_hand():
    # v = (0, 2, 3, 9): leave-one-out a = 9 - 3 = 6, b = 9 - 2 = 7; add-one a = 2, b = 3
    values = np.array([0.0, 2.0, 3.0, 9.0])
    np.testing.assert_allclose(leave_one_out(values), [6.0, 7.0])
    np.testing.assert_allclose(add_one(values), [2.0, 3.0])


def test_position_summary_by_hand():
    # factor a in v = (0, 2, 3, 9): first -> +2, second (after b) -> +6; all orderings: mean 4,
    # min 2, max 6, helps in 100%
    summary = position_summary(np.array([0.0, 2.0, 3.0, 9.0]), 0)
    np.testing.assert_allclose(summary["mean"], [2.0, 6.0, 4.0])
    np.testing.assert_allclose(summary["min"], [2.0, 6.0, 2.0])
    np.testing.assert_allclose(summary["max"], [2.0, 6.0, 6.0])
    np.testing.assert_allclose(summary["share_positive"], [1.0, 1.0, 1.0])


def test_cumulative_means_by_hand():
    # v(none) = .30, v(a) = .36, v(ab) = .38 along a>b: means (.30, .36, .38), deltas (nan, .06, .02)
    values = np.array([0.30, 0.36, 0.31, 0.38])
    means, deltas = cumulative_means(values, path_masks(["a", "b"], ["a", "b"]))
    np.testing.assert_allclose(means, [0.30, 0.36, 0.38])
    np.testing.assert_allclose(deltas[1:], [0.06, 0.02])
    assert np.isnan(deltas[0])


def test_lenth_pse_by_hand():
    # |c| = (10, 1, 2, .5, .2, 1.5, .3): median 1 -> s0 = 1.5; drop |c| >= 3.75 (the 10);
    # median of (1, 2, .5, .2, 1.5, .3) = (.5 + 1) / 2 = .75 -> PSE = 1.5 * .75 = 1.125
    assert lenth_pse(np.array([10, -1, 2, 0.5, -0.2, 1.5, 0.3])) == pytest.approx(1.125)
    # most effects exactly zero (a metric on 4 problems): s0 = 0, nothing below 2.5 s0, no noise level
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lenth_pse(np.array([0.031, 0.0, 0.0])) == 0.0


def test_gain_per_added_mtok_by_hand():
    # +0.08 for 40M generated tokens against the baseline's 30M -> 0.08 / 10 = 0.008 per added Mtok;
    # a cell that adds no tokens has no such ratio
    assert gain_per_added_mtok(0.08, 40e6, 30e6) == pytest.approx(0.008)
    assert np.isnan(gain_per_added_mtok(np.array([0.01]), np.array([30e6]), 30e6)).all()


def test_effects_standard_errors_by_hand():
    # 2^2 design, seeds 0 and 1 (blocks). y: 00 -> (1, 3); a -> (5, 7); b -> (2, 2); ab -> (10, 12)
    # cell means 2, 6, 2, 11. effect a = (6 + 11)/2 - (2 + 2)/2 = 6.5; b = (2 + 11)/2 - (2 + 6)/2 = 2.5;
    # a:b = (2 + 11)/2 - (6 + 2)/2 = 2.5. Seed 1 is +1.5 on average; residuals are +-.25 in three
    # cells and +-.75 in cell b: SSR = 6 * .0625 + 2 * .5625 = 1.5 on 8 - 5 = 3 df, sigma^2 = .5,
    # SE(effect) = 2 * sqrt(.5 / 8) = .5. Each cell's own variance: nu_j = (2-1)(4-1)/4 = .75 df,
    # s^2 = .125 / .75 = 1/6 in three cells and 1.125 / .75 = 1.5 in cell b; W_j = (1/2)^2 / 2 = 1/8,
    # so Var = (3/6 + 1.5) / 8 = .25 (the same SE .5: an effect weighs every cell alike) on
    # Welch-Satterthwaite df (1/16) / ((3 (1/48)^2 + (3/16)^2) / .75) = (1/16) / (7/144) = 9/7
    results = pd.DataFrame(
        {
            "a": [0, 0, 1, 1, 0, 0, 1, 1],
            "b": [0, 0, 0, 0, 1, 1, 1, 1],
            "seed": [0, 1] * 4,
            "avg@32": [1, 3, 5, 7, 2, 2, 10, 12],
        }
    )
    effects = analyze(results, ["a", "b"]).effects.set_index("term")
    np.testing.assert_allclose(effects["effect"], [6.5, 2.5, 2.5])
    np.testing.assert_allclose(effects["se"], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(effects["df"], [9 / 7] * 3)
    half = stats.t.ppf(0.975, 9 / 7) * 0.5
    np.testing.assert_allclose(effects["ci_high"] - effects["effect"], [half] * 3)


def test_intervals_ignore_the_old_seed_option_and_repeat_exactly():
    results = simulate_results(["a", "b"], 0.3, {("a",): 0.1}, seeds=3, rng=0)
    pd.testing.assert_frame_equal(analyze(results, ["a", "b"]).shapley, analyze(results, ["a", "b"]).shapley)


def test_half_fraction_design_and_aliases():
    info = describe_design(np.array(HALF_FRACTION), 5)
    assert info.kind == "fraction" and info.resolution == 5
    assert info.defining_words == ((0, 1, 2, 3, 4),) and info.defining_signs == (-1,)
    factors = ["a", "b", "c", "d", "e"]
    assert defining_relation(info, factors) == "I = -a:b:c:d:e"  # the even half: every abcde column is -1
    odd = describe_design(np.array([m for m in range(32) if bin(m).count("1") % 2 == 1]), 5)
    assert defining_relation(odd, factors) == "I = a:b:c:d:e"
    assert two_factor_chains(info, factors)[0] == "a = -b:c:d:e" and two_factor_chains(odd, factors)[0] == "a = b:c:d:e"
    assert describe_design(np.arange(32), 5).kind == "full"
    assert describe_design(np.array([0, 1, 3, 7, 15, 31]), 5).kind == "incomplete"


@pytest.fixture(scope="module")
def planted_results() -> pd.DataFrame:
    return simulate_results(FACTORS, 0.30, PLANTED, seeds=4, noise_sd=0.01, seed_sd=0.01, rng=1)


@pytest.fixture(scope="module")
def planted(planted_results):
    return analyze(planted_results, FACTORS, orderings="all")


def _cell_means(results: pd.DataFrame) -> np.ndarray:
    """Mean metric per cell bitmask, computed directly with pandas. Shape [2**k]."""
    masks = sum(results[f] * 2**i for i, f in enumerate(FACTORS))
    return results.groupby(masks)["avg@32"].mean().sort_index().to_numpy()


def test_effects_equal_contrasts_of_cell_means(planted, planted_results):
    means = _cell_means(planted_results)
    cells = np.arange(32)
    for term in all_terms(5, 2):
        sign = contrast_column(cells, term)
        direct = means[sign > 0].mean() - means[sign < 0].mean()
        assert planted.effects.set_index("term").loc[term_name(term, FACTORS), "effect"] == pytest.approx(
            direct
        )


def test_shapley_equals_mean_gain_over_all_orderings(planted, planted_results):
    means = _cell_means(planted_results)
    gains = np.zeros(5)
    for order in permutations(range(5)):  # the slow, obvious reference: 120 orderings
        mask = 0
        for i in order:
            gains[i] += means[mask | 1 << i] - means[mask]
            mask |= 1 << i
    np.testing.assert_allclose(planted.shapley["shapley"], gains / 120)
    edge_means = [
        np.mean([means[m | 1 << i] - means[m] for m in range(32) if not m >> i & 1]) for i in range(5)
    ]
    np.testing.assert_allclose(planted.shapley["banzhaf"], edge_means)


def test_shapley_sums_to_full_minus_baseline(planted, planted_results):
    means = _cell_means(planted_results)
    assert planted.shapley_check["ok"]
    assert planted.shapley["shapley"].sum() == pytest.approx(means[31] - means[0])


def test_shapley_and_banzhaf_differ_by_the_three_factor_interaction(planted):
    # the planted OF:CH:DS gain g (level coding) gives each of its factors g/3 in Shapley, g/4 in Banzhaf
    difference = (planted.shapley["shapley"] - planted.shapley["banzhaf"]).to_numpy()
    np.testing.assert_allclose(difference[[0, 1, 4]], 0.04 * (1 / 3 - 1 / 4), atol=0.004)
    np.testing.assert_allclose(difference[[2, 3]], 0.0, atol=0.004)


def test_paper_order_cumulative_rows_equal_cell_means(planted, planted_results):
    means = _cell_means(planted_results)
    paper = planted.cumulative[planted.cumulative["ordering"] == "paper"]
    assert list(paper["step"]) == [0, 1, 2, 3, 4, 5]
    assert list(paper["added"]) == ["baseline", *FACTORS]
    np.testing.assert_allclose(paper["mean"], means[[0, 1, 3, 7, 15, 31]])
    np.testing.assert_allclose(paper["delta"].iloc[1:], np.diff(means[[0, 1, 3, 7, 15, 31]]))
    assert (paper["ci_low"] < paper["mean"]).all() and (paper["mean"] < paper["ci_high"]).all()


def test_all_orderings_average_to_the_shapley_value(planted):
    table = planted.cumulative
    assert table["ordering"].nunique() == 120 and len(table) == 120 * 6
    by_factor = table[table["step"] > 0].groupby("added")["delta"].mean()
    np.testing.assert_allclose(by_factor[FACTORS], planted.shapley["shapley"])
    overall = planted.orderings[planted.orderings["position"] == "all"].set_index("factor")
    np.testing.assert_allclose(overall.loc[FACTORS, "mean"], planted.shapley["shapley"])


def test_planted_interaction_is_significant_and_covered(planted):
    effects = planted.effects.set_index("term")
    truth = true_cell_means(FACTORS, 0.30, PLANTED)
    sign = contrast_column(np.arange(32), (1, 4))
    true_effect = truth[sign > 0].mean() - truth[sign < 0].mean()
    row = effects.loc["clip_higher:dynamic_sampling"]
    assert row["p_value"] < 1e-6
    assert row["ci_low"] <= true_effect <= row["ci_high"]
    assert effects.loc["clip_higher:soft_overlong", "p_value"] > 0.001  # not planted


def test_leave_one_out_equals_cell_differences(planted, planted_results):
    means = _cell_means(planted_results)
    table = planted.leave_one_out
    np.testing.assert_allclose(table["leave_one_out"], [means[31] - means[31 ^ 1 << i] for i in range(5)])
    np.testing.assert_allclose(table["add_one"], [means[1 << i] - means[0] for i in range(5)])


def test_compute_table_counts_discarded_tokens(planted):
    compute = planted.compute.set_index("cell")
    assert compute.loc["GRPO", "gain"] == 0
    # simulate_results: tokens = (10 + factors on) M; DS discards 10% of them
    assert compute.loc["DS", "tokens_generated"] == pytest.approx(11e6)
    assert compute.loc["DS", "discarded_share"] == pytest.approx(0.1)
    # the baseline generates 10M tokens, DS 11M: gain per added million = gain / 1
    assert compute.loc["DS", "gain_per_added_mtok"] == pytest.approx(compute.loc["DS", "gain"] / 1)


def test_half_fraction_recovers_main_effects():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3, noise_sd=0.01, cells=HALF_FRACTION, rng=3)
    analysis = analyze(results, FACTORS)
    truth = true_cell_means(FACTORS, 0.30, PLANTED)
    effects = analysis.effects.set_index("term")
    for i, factor in enumerate(FACTORS):
        on = (np.arange(32) >> i & 1) == 1
        true_main = truth[on].mean() - truth[~on].mean()
        assert effects.loc[factor, "ci_low"] <= true_main <= effects.loc[factor, "ci_high"]
        assert effects.loc[factor, "effect"] == pytest.approx(true_main, abs=0.015)
    assert analysis.design.kind == "fraction"
    # the even half (an even number of factors on): every ABCDE column is -1, I = -ABCDE, A = -BCDE
    assert "overlong_filter = -clip_higher:soft_overlong:token_level_loss:dynamic_sampling" in analysis.aliases
    assert len(analysis.aliases) == 15  # 5 main effects and 10 two-factor interactions, each with its alias
    assert "fitted model" in analysis.values_source
    assert analysis.shapley_check["ok"]


def test_single_seed_uses_lenth_and_says_so():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=1, noise_sd=0.005, rng=4)
    analysis = analyze(results, FACTORS)
    assert "Lenth" in analysis.ci_method and analysis.lenth["m"] == 31
    assert analysis.effects["se"].nunique() == 1  # every effect gets the same PSE
    assert analysis.shapley["ci_low"].notna().all()
    assert analysis.effects.set_index("term").loc[DS, "p_value"] < 0.01


def test_arbitrary_factor_names_use_the_given_order():
    factors = ["eps_high", "kl"]
    results = simulate_results(factors, 0.4, {("eps_high",): 0.05}, seeds=3, rng=5)
    analysis = analyze(results, factors)
    assert set(analysis.cumulative["ordering"]) == {"given"}
    assert analysis.paper_reference is None
    assert cell_label(0, factors) == "baseline" and cell_label(3, factors) == "eps_high+kl"
    assert any("given factor order" in note for note in analysis.notes)


def test_custom_orderings_accept_short_labels():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=6)
    analysis = analyze(results, FACTORS, orderings=[["DS", "OF"], ["OF", "CH", "SP", "TL", "DS"]])
    assert list(dict.fromkeys(analysis.cumulative["ordering"])) == ["DS>OF", "paper"]


def test_incomplete_design_reports_what_it_supports():
    path = [0, 1, 3, 7, 15, 31]  # the paper's path only, like the paper's own table
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3, cells=path, rng=7)
    analysis = analyze(results, FACTORS)
    assert analysis.design.kind == "incomplete"
    assert analysis.cumulative["mean"].notna().all()  # the paper path is fully observed
    assert analysis.shapley["shapley"].isna().all() and analysis.orderings.empty
    assert analysis.leave_one_out["add_one"].iloc[0] == pytest.approx(analysis.cumulative["delta"].iloc[1])
    assert any("missing" in note and "Shapley" in note for note in analysis.notes)


def test_declared_full_design_with_a_missing_cell_names_it():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, cells=list(range(31)), rng=8)
    with pytest.raises(ReportInputError, match=r"cell .*\(OF\+CH\+SP\+TL\+DS\)"):
        analyze(results, FACTORS, design="full")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda df: df.drop(columns=["clip_higher"]), "factor column 'clip_higher' is missing"),
        (lambda df: df.drop(columns=["avg@32"]), "metric column 'avg@32' is missing"),
        (
            lambda df: df.assign(soft_overlong=df["soft_overlong"] * 2),
            "factor column 'soft_overlong' has level 2",
        ),
        (
            lambda df: df.assign(**{"avg@32": df["avg@32"].where(df.index != 11)}),
            r"cell .*\(OF\+SP\), seed 1;",
        ),
        (lambda df: pd.concat([df, df.iloc[:1]]), r"cell .*\(GRPO\) has more than one row for seed 0"),
        (lambda df: df.drop(columns=["seed"]), "column 'seed' is missing"),
    ],
)
def test_bad_results_tables_name_the_column_or_cell(change, message):
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=9)
    with pytest.raises(ReportInputError, match=message):
        validate_results(change(results), FACTORS, "avg@32")


def test_infer_factors_takes_the_zero_one_columns():
    results = simulate_results(["a", "b"], 0.3, {}, seeds=2, rng=0).assign(**{"pass@32": 1})
    assert infer_factors(results, "avg@32") == ["a", "b"]


def test_wilson_interval_by_hand():
    # 15 of 300: centre (.05 + 1.96^2 / 600) / (1 + 1.96^2 / 300) = .0557, half-width
    # 1.96 sqrt(.05 x .95 / 300 + 1.96^2 / 360000) / 1.0128 = .0252 -> (.0305, .0808)
    low, high = wilson_interval(15, 300)
    assert (low, high) == pytest.approx((0.0305, 0.0808), abs=5e-4)
    assert wilson_interval(0, 300)[0] == 0.0 and wilson_interval(300, 300)[1] == pytest.approx(1.0)
