"""One inference engine: every number a report shows is a linear contrast c'mu of cell means.

Model, seeds as blocks (seed = data order and initialisation, shared by the cells that ran it):

    y_i = mu_{cell(i)} + b_{seed(i)} + e_i,   e_i ~ N(0, sigma^2),   sum_s b_s = 0

fitted by least squares in the within-seed form (no dense n x seeds dummy matrix). With
A the run-by-cell indicator, N = A'B the cell-by-seed count matrix and r_s the runs of seed s,
the information matrix of the cell means is (Schur complement of the seed block)

    G = diag(n) - N diag(1/r) N' + q q' / sum_s(1/r_s),    q = N (1/r),

so mu_hat = G^-1 A'M y, Var(c'mu_hat) = sigma^2 c' G^-1 c and the residual df are
n - m - (S - 1): the same formula covers balanced data, a missing run and unequal seed counts.
For balanced data G = s I, mu_hat is the plain cell mean, and the interval of c'mu is
c'mu_hat +- t(df) sqrt(MSE sum(c^2) / s). The cell means are those of *these* seeds (fixed
blocks): a contrast (sum c = 0) does not depend on that; a cell's level does, and the report
says how far the seed means spread.

Seeds are used as blocks when at least two seeds exist and the cells-seeds graph is connected
(every cell reaches every other through shared seeds); otherwise (e.g. seeds numbered per
cell) the seed effect is part of the run noise and the model is the plain one-way layout.

Unequal variances: Bartlett's test across cells (on the residuals of cells with >= 2 runs,
level EQUAL_VARIANCE_ALPHA). When it rejects, each statistic falls back on its own to the
paired seed-level t (every cell it involves ran the same >= 2 seeds: the statistic is
computed per seed, t on seeds - 1 df) or else Welch's t with Satterthwaite df; ``se_method``
names what each statistic used. One run per cell: no residual df; full and regular fractional
designs then take the noise from Lenth's pseudo standard error (see ``effects``).

Everything is exact (no resampling): the same table gives the same intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse, stats
from scipy.sparse.csgraph import connected_components

EQUAL_VARIANCE_ALPHA = 0.01
"""Bartlett's test rejecting equal variances at this level switches to per-statistic fallbacks."""

OLS, PAIRED, WELCH, LENTH, NONE = "ols", "paired", "welch", "lenth", "none"


@dataclass(frozen=True)
class CellFit:
    """The fitted cell-means model of one metric."""

    masks: np.ndarray  # [m] observed cells (bitmasks), sorted
    n: np.ndarray  # [m] runs per cell
    raw_mean: np.ndarray  # [m] plain mean over the cell's runs
    sd: np.ndarray  # [m] sd over the cell's runs (ddof=1; NaN for one run)
    mu: np.ndarray  # [m] estimated cell means (seed-adjusted when blocked)
    g_inv: np.ndarray  # [m, m] Var(mu_hat) = sigma2 * g_inv
    sigma2: float  # residual mean square (NaN without residual df)
    df: float  # residual degrees of freedom
    blocked: bool  # seeds entered as blocks
    n_seeds: int
    seed_sd: float  # sd of the estimated seed effects b_s (NaN unless blocked)
    mean_inv_r: float  # mean over seeds of 1 / runs of the seed (NaN unless blocked)
    equal_var_p: float  # Bartlett's p-value (NaN when not testable)
    cell_var: np.ndarray  # [m] residual variance per cell (for Welch)
    cell_index: np.ndarray  # [runs] position of each run's cell in masks
    seed_index: np.ndarray  # [runs] 0..n_seeds-1
    y: np.ndarray  # [runs]

    @property
    def unequal_variances(self) -> bool:
        return bool(self.equal_var_p < EQUAL_VARIANCE_ALPHA)


def _connected(cell_index: np.ndarray, seed_index: np.ndarray, m: int, s: int) -> bool:
    """Whether the bipartite graph cells - seeds (edge: a run) is connected."""
    graph = sparse.coo_matrix(
        (np.ones(len(cell_index)), (cell_index, m + seed_index)), shape=(m + s, m + s)
    ).tocsr()
    count, _ = connected_components(graph, directed=False)
    return count == 1


def _blocked_system(cell_index, seed_index, y, m: int, s: int):
    """(G, A'My, b-recovery) of the within-seed form; see the module docstring."""
    counts = sparse.coo_matrix((np.ones(len(y)), (cell_index, seed_index)), shape=(m, s)).tocsr()
    r = np.bincount(seed_index, minlength=s).astype(float)
    seed_sums = np.bincount(seed_index, weights=y, minlength=s)
    n = np.bincount(cell_index, minlength=m).astype(float)
    cell_sums = np.bincount(cell_index, weights=y, minlength=m)
    scaled = counts.multiply(1.0 / r).tocsr()  # N diag(1/r)
    q = np.asarray(scaled.sum(axis=1)).ravel()
    inv_r = float(np.sum(1.0 / r))
    g = np.diag(n) - (scaled @ counts.T).toarray() + np.outer(q, q) / inv_r
    rhs = cell_sums - scaled @ seed_sums + q * float(np.sum(seed_sums / r)) / inv_r
    return g, rhs


def _bartlett(residual: np.ndarray, cell_index: np.ndarray, n: np.ndarray) -> float:
    """Bartlett's p-value for equal residual variance across cells with >= 2 runs (NaN if < 2)."""
    groups = [residual[cell_index == j] for j in np.flatnonzero(n >= 2)]
    groups = [g for g in groups if np.var(g) > 0]
    if len(groups) < 2:
        return float("nan")
    return float(stats.bartlett(*groups).pvalue)


def fit_cells(cell_index: np.ndarray, seed_index: np.ndarray, y: np.ndarray, masks: np.ndarray) -> CellFit:
    """Fit the cell-means model with seeds as blocks when the design allows (module docstring).

    cell_index [runs] in 0..m-1 (position in ``masks``), seed_index [runs] in 0..S-1, y [runs].
    """
    m, s = len(masks), int(seed_index.max()) + 1
    n = np.bincount(cell_index, minlength=m).astype(float)
    raw_mean = np.bincount(cell_index, weights=y, minlength=m) / n
    blocked = s >= 2 and _connected(cell_index, seed_index, m, s)
    if blocked:
        g, rhs = _blocked_system(cell_index, seed_index, y, m, s)
        g_inv = np.linalg.inv(g)
        mu = g_inv @ rhs
        partial = y - mu[cell_index]
        b = np.bincount(seed_index, weights=partial, minlength=s) / np.bincount(seed_index, minlength=s)
        residual = partial - b[seed_index]
        df = len(y) - m - (s - 1)
        seed_sd = float(np.std(b, ddof=1))
        mean_inv_r = float(np.mean(1.0 / np.bincount(seed_index, minlength=s)))
    else:
        g_inv, mu = np.diag(1.0 / n), raw_mean
        residual = y - mu[cell_index]
        df, seed_sd, mean_inv_r = len(y) - m, float("nan"), float("nan")
    sse = float(residual @ residual)
    sigma2 = sse / df if df > 0 else float("nan")
    sq = np.bincount(cell_index, weights=(y - raw_mean[cell_index]) ** 2, minlength=m)
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.where(n > 1, np.sqrt(sq / np.maximum(n - 1, 1)), np.nan)
        res_sq = np.bincount(cell_index, weights=residual**2, minlength=m)
        cell_var = np.where(n > 1, res_sq / np.maximum(n - 1, 1), np.nan)
    return CellFit(
        masks=masks, n=n, raw_mean=raw_mean, sd=sd, mu=mu, g_inv=g_inv, sigma2=sigma2,
        df=float(max(df, 0)), blocked=blocked, n_seeds=s, seed_sd=seed_sd, mean_inv_r=mean_inv_r,
        equal_var_p=_bartlett(residual, cell_index, n) if df > 0 else float("nan"),
        cell_var=cell_var, cell_index=cell_index, seed_index=seed_index, y=y,
    )  # fmt: skip


@dataclass(frozen=True)
class Estimates:
    """Per statistic (row of a contrast matrix): estimate, SE, df, interval, p-value, method."""

    estimate: np.ndarray
    se: np.ndarray
    df: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p_value: np.ndarray  # two-sided, H0: the statistic is 0
    method: np.ndarray  # OLS | PAIRED | WELCH | LENTH | NONE per statistic


@dataclass(frozen=True)
class Noise:
    """Where the residual variance comes from: the fit, or Lenth's PSE with one run per cell."""

    sigma2: float
    df: float
    method: str  # OLS or LENTH (NONE: no estimate)


def _paired(fit: CellFit, c: np.ndarray) -> tuple[float, float] | None:
    """(SE, df) of the per-seed statistic when every involved cell ran the same >= 2 seeds."""
    involved = np.flatnonzero(c != 0)
    rows = np.isin(fit.cell_index, involved)
    seeds_of = [set(fit.seed_index[rows & (fit.cell_index == j)]) for j in involved]
    common = seeds_of[0]
    if len(common) < 2 or any(s != common for s in seeds_of) or any(
        fit.n[j] != len(common) for j in involved
    ):
        return None
    per_seed = np.bincount(
        fit.seed_index[rows], weights=c[fit.cell_index[rows]] * fit.y[rows], minlength=fit.n_seeds
    )[sorted(common)]
    return float(np.std(per_seed, ddof=1) / np.sqrt(len(per_seed))), float(len(per_seed) - 1)


def _welch(fit: CellFit, c: np.ndarray) -> tuple[float, float] | None:
    """(SE, Satterthwaite df) from per-cell variances; None if an involved cell has one run."""
    involved = np.flatnonzero(c != 0)
    if (fit.n[involved] < 2).any():
        return None
    parts = c[involved] ** 2 * fit.cell_var[involved] / fit.n[involved]
    total = parts.sum()
    if total <= 0:
        return None
    return float(np.sqrt(total)), float(total**2 / np.sum(parts**2 / (fit.n[involved] - 1)))


def estimate(fit: CellFit, contrasts: np.ndarray, noise: Noise, confidence: float) -> Estimates:
    """Estimates of the statistics c_j'mu, one per row of ``contrasts`` [q, m].

    Rows with a NaN (a statistic needing a cell the design lacks) give NaN throughout.
    """
    contrasts = np.atleast_2d(np.asarray(contrasts, dtype=float))
    valid = ~np.isnan(contrasts).any(axis=1)
    c = np.where(valid[:, None], contrasts, 0.0)
    point = np.where(valid, c @ fit.mu, np.nan)
    unit = np.einsum("ij,jk,ik->i", c, fit.g_inv, c)  # c' G^-1 c
    se = np.sqrt(noise.sigma2 * unit) if noise.method != NONE else np.full(len(c), np.nan)
    df = np.full(len(c), noise.df if noise.method != NONE else np.nan)
    method = np.array([noise.method] * len(c), dtype=object)
    if noise.method == OLS and fit.unequal_variances:
        for j in np.flatnonzero(valid & (unit > 0)):
            paired = _paired(fit, c[j])
            fallback = paired or _welch(fit, c[j])
            if fallback is not None:
                se[j], df[j] = fallback
                method[j] = PAIRED if paired is not None else WELCH
    se = np.where(valid, se, np.nan)
    return _intervals(point, se, df, method, confidence)


def estimate_over_new_seeds(fit: CellFit, contrasts: np.ndarray, noise: Noise, confidence: float) -> Estimates:
    """Levels (sum c != 0, e.g. a cell mean) with the seed effect counted as random: what a rerun
    with new seeds would average. Var = MSE c'G^-1c + (sum c)^2 sigma_b^2 / S, with sigma_b^2 =
    var(b_hat) - MSE mean(1/r_s) (the seed effects' spread beyond their own noise), so

        Var = (sum c)^2 var(b_hat) / S + MSE (c'G^-1c - (sum c)^2 mean(1/r_s) / S),

    Satterthwaite df from S - 1 and the residual df; a non-positive sigma_b^2 estimate leaves the
    blocked interval as it is. Without seed blocks the seed effect is already in the noise."""
    fixed = estimate(fit, contrasts, noise, confidence)
    if not fit.blocked or noise.method != OLS or not np.isfinite(fit.seed_sd):
        return fixed
    c = np.nan_to_num(np.atleast_2d(contrasts))
    total = c.sum(axis=1) ** 2 / fit.n_seeds
    seed_part = total * fit.seed_sd**2
    noise_part = fit.sigma2 * (np.einsum("ij,jk,ik->i", c, fit.g_inv, c) - total * fit.mean_inv_r)
    random = seed_part > total * fit.sigma2 * fit.mean_inv_r  # sigma_b^2 estimate > 0
    var = seed_part + noise_part
    df = (var**2) / (seed_part**2 / max(fit.n_seeds - 1, 1) + noise_part**2 / noise.df)
    se = np.where(random, np.sqrt(var), fixed.se)
    df = np.where(random, df, fixed.df)
    return _intervals(fixed.estimate, se, df, fixed.method, confidence)


def _intervals(point, se, df, method, confidence: float) -> Estimates:
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (df > 0) & (se > 0) & np.isfinite(se)
        quantile = np.where(ok, stats.t.ppf(0.5 + confidence / 2, np.where(ok, df, 1)), np.nan)
        half = quantile * se
        p = np.where(ok, 2 * stats.t.sf(np.abs(point) / np.where(ok, se, 1), np.where(ok, df, 1)), np.nan)
    half = np.where(ok | (se == 0), np.where(se == 0, 0.0, half), np.nan)
    method = np.where(np.isnan(se), NONE, method)
    return Estimates(point, se, df, point - half, point + half, p, method)
