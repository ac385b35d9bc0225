"""The inference engine against independent computations: dense OLS and its sandwich with each
cell's own variance, statsmodels' HC2 and scipy's Welch t, hand formulas, orderings enumerated
one by one; one SE method whatever the data (no pre-test)."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
import statsmodels.api as sm

from dapo_ablate.reports import PAPER_FACTORS, analyze
from dapo_ablate.reports.inference import WELCH, Noise, estimate, fit_cells
from dapo_ablate.reports.simulate import simulate_results


FACTORS = list(PAPER_FACTORS)
PLANTED = {(FACTORS[0],): 0.06, (FACTORS[4],): 0.08, (FACTORS[1], FACTORS[4]): 0.03}


def _contrast_columns(k: int) -> np.ndarray:
    """-1/+1 columns of every term over the 2^k cells, by the obvious product: [2**k, 2**k - 1]."""
    cells = np.arange(2**k)
    columns = []
    for term in range(1, 2**k):  # term as a bitmask of factors
        sign = np.ones(2**k)
        for i in range(k):
            if term >> i & 1:
                sign *= np.where(cells >> i & 1, 1.0, -1.0)
        columns.append(sign)
    return np.array(columns).T


def _ordering_contrasts(k: int):
    """Shapley c (mean gain over all k! orderings) and c by position, enumerated one ordering at a time."""
    shapley = np.zeros((k, 2**k))
    by_position = np.zeros((k, k, 2**k))
    count = np.zeros((k, k))
    for order in permutations(range(k)):
        mask = 0
        for position, i in enumerate(order):
            gain = np.zeros(2**k)
            gain[mask | 1 << i] += 1
            gain[mask] -= 1
            shapley[i] += gain
            by_position[i, position] += gain
            count[i, position] += 1
            mask |= 1 << i
    return shapley / len(list(permutations(range(k)))), by_position / count[..., None]


@pytest.fixture(scope="module")
def balanced():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3, noise_sd=0.015, seed_sd=0.01, rng=11)
    return results, analyze(results, FACTORS)


def _dense_fit(results: pd.DataFrame):
    """Dense OLS with cell dummies and sum-to-zero seed effects (the obvious, slow reference):
    (X, beta, residuals, hat diagonal, each run's cell)."""
    masks = sum(results[f].to_numpy() << i for i, f in enumerate(FACTORS))
    cells = (masks[:, None] == np.arange(32)).astype(float)
    seed = results["seed"].to_numpy()
    last = seed.max()
    blocks = np.column_stack([(seed == s).astype(float) - (seed == last) for s in range(last)])
    x = np.column_stack([cells, blocks])
    y = results["avg@32"].to_numpy()
    xtx_inv = np.linalg.inv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    hat = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
    return x, xtx_inv, beta, y - x @ beta, hat, masks


def _dense_cell_variance_cov(results: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(beta, sandwich covariance with each cell's own variance, s_j^2, nu_j):
    s_j^2 = sum_{i in j} res_i^2 / sum_{i in j} (1 - h_ii), V = (X'X)^-1 X' diag(s^2_cell(i)) X (X'X)^-1."""
    x, xtx_inv, beta, res, hat, masks = _dense_fit(results)
    nu = np.bincount(masks, weights=1 - hat, minlength=32)
    s2 = np.bincount(masks, weights=res**2, minlength=32) / nu
    cov = xtx_inv @ x.T @ (s2[masks][:, None] * x) @ xtx_inv
    return beta, cov, s2, nu


def test_balanced_intervals_are_the_textbook_formula(balanced):
    """Balanced, seeds as blocks: c'mu +- t(df_c) sqrt(sum_j c_j^2 s_j^2 / 3), s_j^2 from the
    two-way residuals y_js - ybar_j. - ybar_.s + ybar_.. of cell j over nu = 2 x 31 / 32 df, and
    df_c = (sum_j c_j^2 s_j^2)^2 / sum_j (c_j^2 s_j^2)^2 / nu (Welch-Satterthwaite); to 1e-9."""
    results, analysis = balanced
    masks = sum(results[f] * 2**i for i, f in enumerate(FACTORS))
    y = results.pivot_table(index=masks, columns="seed", values="avg@32").sort_index().to_numpy()  # [32, 3]
    mu = y.mean(axis=1)
    residual = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    nu = 2 * 31 / 32
    s2 = (residual**2).sum(axis=1) / nu
    assert analysis.fit.df == 62
    np.testing.assert_allclose(analysis.fit.cell_var, s2, atol=1e-15)

    def check(c: np.ndarray, low, high):
        c = np.atleast_2d(c)
        parts = c**2 * s2 / 3
        df = parts.sum(axis=1) ** 2 / (parts**2 / nu).sum(axis=1)
        half = stats.t.ppf(0.975, df) * np.sqrt(parts.sum(axis=1))
        np.testing.assert_allclose(low, c @ mu - half, rtol=0, atol=1e-9)
        np.testing.assert_allclose(high, c @ mu + half, rtol=0, atol=1e-9)

    eye = np.eye(32)
    check(eye, analysis.cells["ci_low"], analysis.cells["ci_high"])
    shapley, by_position = _ordering_contrasts(5)
    check(shapley, analysis.shapley["ci_low"], analysis.shapley["ci_high"])
    edges = [[eye[m | 1 << i] - eye[m] for m in range(32) if not m >> i & 1] for i in range(5)]
    banzhaf = np.array([np.mean(e, axis=0) for e in edges])
    check(banzhaf, analysis.shapley["banzhaf_ci_low"], analysis.shapley["banzhaf_ci_high"])
    loo = np.array([eye[31] - eye[31 ^ 1 << i] for i in range(5)])
    add = np.array([eye[1 << i] - eye[0] for i in range(5)])
    check(loo, analysis.leave_one_out["loo_ci_low"], analysis.leave_one_out["loo_ci_high"])
    check(add, analysis.leave_one_out["add_one_ci_low"], analysis.leave_one_out["add_one_ci_high"])
    check(loo - add, analysis.order_gaps["ci_low"], analysis.order_gaps["ci_high"])
    path = [0, 1, 3, 7, 15, 31]
    check(eye[path], analysis.cumulative["ci_low"], analysis.cumulative["ci_high"])
    steps = analysis.cumulative.iloc[1:]
    check(eye[path[1:]] - eye[path[:-1]], steps["delta_ci_low"], steps["delta_ci_high"])
    orderings = analysis.orderings
    for i, factor in enumerate(FACTORS):
        rows = orderings[(orderings["factor"] == factor) & (orderings["position"] != "all")]
        check(by_position[i], rows["ci_low"], rows["ci_high"])
    columns = _contrast_columns(5)
    two_factor = [t for t in range(1, 32) if bin(t).count("1") <= 2]
    two_factor.sort(key=lambda t: (bin(t).count("1"), [i for i in range(5) if t >> i & 1]))
    c = columns[:, [t - 1 for t in two_factor]].T / 16
    check(c, analysis.effects["ci_low"], analysis.effects["ci_high"])
    # an effect weighs every cell alike: its SE is the pooled one, sqrt(MSE sum(c^2) / 3); only its df differ
    mse = (residual**2).sum() / 62
    np.testing.assert_allclose(analysis.effects["se"], np.sqrt(mse * (c**2).sum(axis=1) / 3), rtol=1e-12)
    assert (analysis.effects["df"] < 62).all()
    assert set(analysis.intervals["se_method"]) == {WELCH}


def test_missing_run_matches_the_dense_sandwich_with_each_cells_variance(balanced):
    """One run dropped: estimates equal the dense OLS with sum-to-zero seed effects, SEs its
    sandwich with each cell's own (leverage-corrected) variance, to 1e-12."""
    results, _ = balanced
    results = results.drop(index=40).reset_index(drop=True)
    analysis = analyze(results, FACTORS)
    beta, cov, s2, nu = _dense_cell_variance_cov(results)
    assert analysis.fit.df == 95 - 32 - 2
    np.testing.assert_allclose(analysis.fit.cell_df, nu, atol=1e-12)
    np.testing.assert_allclose(analysis.fit.cell_var, s2, atol=1e-15)
    np.testing.assert_allclose(analysis.cells["mean"], beta[:32], atol=1e-12)
    est = analysis.intervals.query("table == 'cells'")
    np.testing.assert_allclose(est["se"], np.sqrt(np.diag(cov)[:32]), atol=1e-12)
    shapley, _ = _ordering_contrasts(5)
    c = np.column_stack([shapley, np.zeros((5, 2))])
    se = np.sqrt(np.einsum("ij,jk,ik->i", c, cov, c))
    np.testing.assert_allclose(analysis.shapley["shapley"], c @ beta, atol=1e-12)
    phi = analysis.intervals.query("table == 'shapley' and column == 'shapley'")
    np.testing.assert_allclose(phi["se"], se, atol=1e-12)


def test_seeds_numbered_per_cell_are_not_blocks():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3, seed_sd=0.01, rng=12, seeds_per_cell=True)
    analysis = analyze(results, FACTORS)
    assert not analysis.fit.blocked and analysis.fit.df == 96 - 32
    sd = results.groupby(sum(results[f] * 2**i for i, f in enumerate(FACTORS)))["avg@32"].var(ddof=1)
    assert analysis.fit.sigma2 == pytest.approx(sd.mean())  # pooled within-cell variance
    assert any("do not share seeds" in note for note in analysis.notes)


def test_one_method_whatever_the_variances_and_noisy_cells_widen_only_what_uses_them():
    """No pre-test: the same SE formula with equal and with very unequal cell variances; a
    statistic that does not touch the noisy cells keeps its SE from the quiet ones."""
    ds_cells = {m: 3.0 for m in range(32) if m >> 4 & 1}  # every cell with dynamic sampling: 3x the noise sd
    calm = analyze(simulate_results(FACTORS, 0.30, PLANTED, seeds=10, noise_sd=0.01, rng=13), FACTORS)
    rough = analyze(simulate_results(FACTORS, 0.30, PLANTED, seeds=10, noise_sd=0.01, rng=13, noisy_cells=ds_cells), FACTORS)
    assert set(calm.intervals["se_method"]) == set(rough.intervals["se_method"]) == {WELCH}
    assert "pre-test" in rough.ci_method and "Bartlett" not in rough.ci_method
    add = lambda a: a.intervals.query("table == 'leave_one_out' and column == 'add_one'").set_index("row")  # noqa: E731
    # OF added to GRPO touches no DS cell: about the same SE (the same draws: only the DS cells' noise is
    # scaled, and the seed effects' estimate shares a little of it); DS added to GRPO touches one: wider
    assert add(rough).loc[FACTORS[0], "se"] == pytest.approx(add(calm).loc[FACTORS[0], "se"], rel=0.2)
    assert add(rough).loc[FACTORS[4], "se"] > 1.6 * add(calm).loc[FACTORS[4], "se"]


def test_without_seed_blocks_it_is_welchs_t_and_statsmodels_hc2():
    # two cells, seeds numbered per cell, very different spreads: scipy's Welch t
    y = np.array([1.0, 1.1, 0.9, 1.05, 3.0, 5.0, 1.0, 4.0])
    cell = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    fit = fit_cells(cell, np.arange(8), y, np.array([0, 1]))
    assert not fit.blocked
    result = estimate(fit, np.array([[-1.0, 1.0]]), Noise(fit.sigma2, fit.df, WELCH), 0.95)
    welch = stats.ttest_ind(y[4:], y[:4], equal_var=False)
    assert result.method[0] == WELCH
    assert result.p_value[0] == pytest.approx(welch.pvalue, rel=1e-10)
    assert result.df[0] == pytest.approx(welch.df, rel=1e-10)
    # six cells of 3-5 runs: every contrast's SE is statsmodels' HC2 on cell dummies
    rng = np.random.default_rng(3)
    cell = np.repeat(np.arange(6), [3, 4, 5, 3, 4, 5])
    y = rng.normal(0, 1, len(cell)) * np.array([1, 1, 3, 1, 2, 1])[cell]
    fit = fit_cells(cell, np.arange(len(y)), y, np.arange(6))
    c = np.array([[1, -1, 0, 0, 0, 0], [0.5, 0.5, -1, 0, 0, 0], [0, 0, 0, 1, 0, 0.0]])
    hc2 = sm.OLS(y, (cell[:, None] == np.arange(6)).astype(float)).fit(cov_type="HC2").cov_params()
    ours = estimate(fit, c, Noise(fit.sigma2, fit.df, WELCH), 0.95)
    np.testing.assert_allclose(ours.se, np.sqrt(np.einsum("ij,jk,ik->i", c, hc2, c)), rtol=1e-12)


def test_within_seed_form_handles_thousands_of_seeds():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3000, noise_sd=0.015, seed_sd=0.01, rng=14)
    results = results.sample(frac=0.99, random_state=0).reset_index(drop=True)  # unbalanced
    analysis = analyze(results, FACTORS)
    assert analysis.fit.blocked and analysis.fit.df == len(results) - 32 - (3000 - 1)
    effects = analysis.effects.set_index("term")
    assert effects.loc["dynamic_sampling", "ci_low"] < 0.08 + 0.015 < effects.loc["dynamic_sampling", "ci_high"]
