"""The inference engine against independent computations: dense OLS, hand formulas, orderings
enumerated one by one, and the fallbacks it promises."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dapo_ablate.reports import PAPER_FACTORS, analyze
from dapo_ablate.reports.inference import PAIRED, estimate, fit_cells, Noise, OLS
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


def _dense_mse(results: pd.DataFrame) -> tuple[float, int]:
    """MSE and df of OLS on dense cell and seed dummies (the obvious, slow reference)."""
    masks = sum(results[f].to_numpy() << i for i, f in enumerate(FACTORS))
    cells = (masks[:, None] == np.arange(32)).astype(float)
    seeds = sorted(results["seed"].unique())
    blocks = np.column_stack([(results["seed"] == s).to_numpy(float) for s in seeds[1:]])
    x = np.column_stack([cells, blocks])
    y = results["avg@32"].to_numpy()
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - np.linalg.matrix_rank(x)
    return float(np.sum((y - x @ beta) ** 2) / df), df


def test_balanced_intervals_are_the_textbook_formula(balanced):
    """Every interval = c'mu +- t(62) sqrt(MSE sum(c^2) / 3), to 1e-9, for every table."""
    results, analysis = balanced
    mse, df = _dense_mse(results)
    assert df == 62 and analysis.fit.df == 62
    masks = sum(results[f] * 2**i for i, f in enumerate(FACTORS))
    mu = results.groupby(masks)["avg@32"].mean().sort_index().to_numpy()
    t = stats.t.ppf(0.975, 62)

    def check(c: np.ndarray, low, high):
        c = np.atleast_2d(c)
        half = t * np.sqrt(mse * (c**2).sum(axis=1) / 3)
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
    check(columns[:, [t - 1 for t in two_factor]].T / 16, analysis.effects["ci_low"], analysis.effects["ci_high"])
    assert (analysis.effects["df"] == 62).all()
    assert set(analysis.intervals["se_method"]) == {"ols"} and (analysis.intervals["df"] == 62).all()


def test_missing_run_matches_dense_ols_with_seed_blocks(balanced):
    """One run dropped: estimates, SEs and df equal the dense OLS with sum-to-zero seed effects."""
    results, _ = balanced
    results = results.drop(index=40).reset_index(drop=True)
    analysis = analyze(results, FACTORS)
    masks = sum(results[f].to_numpy() << i for i, f in enumerate(FACTORS))
    cells = (masks[:, None] == np.arange(32)).astype(float)
    seed = results["seed"].to_numpy()
    blocks = np.column_stack([(seed == s).astype(float) - (seed == 2) for s in (0, 1)])  # sum-to-zero coding
    x = np.column_stack([cells, blocks])
    y = results["avg@32"].to_numpy()
    xtx_inv = np.linalg.inv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    df = len(y) - x.shape[1]
    mse = np.sum((y - x @ beta) ** 2) / df
    assert analysis.fit.df == df == 95 - 32 - 2
    np.testing.assert_allclose(analysis.cells["mean"], beta[:32], atol=1e-12)
    se_cells = np.sqrt(mse * np.diag(xtx_inv)[:32])
    t = stats.t.ppf(0.975, df)
    np.testing.assert_allclose(analysis.cells["ci_high"] - analysis.cells["mean"], t * se_cells, atol=1e-12)
    shapley, _ = _ordering_contrasts(5)
    c = np.column_stack([shapley, np.zeros((5, 2))])
    se = np.sqrt(mse * np.einsum("ij,jk,ik->i", c, xtx_inv, c))
    np.testing.assert_allclose(analysis.shapley["shapley"], c @ beta, atol=1e-12)
    np.testing.assert_allclose(analysis.shapley["ci_high"] - analysis.shapley["shapley"], t * se, atol=1e-12)


def test_seeds_numbered_per_cell_are_not_blocks():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3, seed_sd=0.01, rng=12, seeds_per_cell=True)
    analysis = analyze(results, FACTORS)
    assert not analysis.fit.blocked and analysis.fit.df == 96 - 32
    sd = results.groupby(sum(results[f] * 2**i for i, f in enumerate(FACTORS)))["avg@32"].var(ddof=1)
    assert analysis.fit.sigma2 == pytest.approx(sd.mean())  # pooled within-cell variance
    assert any("do not share seeds" in note for note in analysis.notes)


def test_unequal_variances_fall_back_per_statistic_to_paired_seed_t():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=4, noise_sd=0.002, rng=13)
    noisy = results["dynamic_sampling"] == 1
    results.loc[noisy, "avg@32"] += np.random.default_rng(0).normal(0, 0.05, noisy.sum())
    analysis = analyze(results, FACTORS)
    assert analysis.fit.unequal_variances and "Bartlett" in analysis.ci_method
    row = analysis.intervals.query("table == 'leave_one_out' and row == 'dynamic_sampling' and column == 'add_one'")
    assert row["se_method"].item() == PAIRED and row["df"].item() == 3
    # the paired seed-level t by hand: per seed, v(DS) - v(none)
    per_seed = (
        results[(results[FACTORS].sum(axis=1) == 1) & noisy].set_index("seed")["avg@32"]
        - results[results[FACTORS].sum(axis=1) == 0].set_index("seed")["avg@32"]
    )
    assert row["se"].item() == pytest.approx(per_seed.std(ddof=1) / 2)


def test_welch_fallback_when_cells_do_not_share_seeds():
    # two cells, seeds numbered per cell, very different spreads: Welch-Satterthwaite
    y = np.array([1.0, 1.1, 0.9, 1.05, 3.0, 5.0, 1.0, 4.0])
    cell = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    fit = fit_cells(cell, np.arange(8), y, np.array([0, 1]))
    assert not fit.blocked
    result = estimate(fit, np.array([[-1.0, 1.0]]), Noise(fit.sigma2, fit.df, OLS), 0.95)
    assert fit.unequal_variances  # variances .0042 and 3.58 on 3 df each
    v0, v1 = y[:4].var(ddof=1) / 4, y[4:].var(ddof=1) / 4
    assert result.method[0] == "welch"
    assert result.se[0] == pytest.approx(np.sqrt(v0 + v1))
    assert result.df[0] == pytest.approx((v0 + v1) ** 2 / (v0**2 / 3 + v1**2 / 3))


def test_within_seed_form_handles_thousands_of_seeds():
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3000, noise_sd=0.015, seed_sd=0.01, rng=14)
    results = results.sample(frac=0.99, random_state=0).reset_index(drop=True)  # unbalanced
    analysis = analyze(results, FACTORS)
    assert analysis.fit.blocked and analysis.fit.df == len(results) - 32 - (3000 - 1)
    effects = analysis.effects.set_index("term")
    assert effects.loc["dynamic_sampling", "ci_low"] < 0.08 + 0.015 < effects.loc["dynamic_sampling", "ci_high"]
