"""One inference engine: every number a report shows is a linear contrast c'mu of cell means.

Model, seeds as blocks (seed = data order and initialisation, shared by the cells that ran it):

    y_i = mu_{cell(i)} + b_{seed(i)} + e_i,   e_i ~ N(0, sigma_{cell(i)}^2),   sum_s b_s = 0

fitted by least squares in the within-seed form (no dense n x seeds dummy matrix). With
A the run-by-cell indicator, N = A'B the cell-by-seed count matrix and r_s the runs of seed s,
the information matrix of the cell means is (Schur complement of the seed block)

    G = diag(n) - N diag(1/r) N' + q q' / sum_s(1/r_s),    q = N (1/r),

so mu_hat = G^-1 A'M y = L y: every statistic c'mu_hat = l'y with run weights l = L'c. The
residual df are n - m - (S - 1); the same formulas cover balanced data, a missing run and
unequal seed counts. Seeds are used as blocks when at least two seeds exist and the cells-seeds
graph is connected (every cell reaches every other through shared seeds); otherwise (e.g. seeds
numbered per cell) the seed effect is part of the run noise and the model is the one-way layout.

Standard errors: one method, whatever the data look like (no pre-test). Each cell keeps its own
residual variance, because the techniques change how noisy training is (dynamic sampling, the
length penalty) and a pooled variance under-covers every statistic that leans on a noisy cell
(choosing between pooled and per-cell by a Bartlett pre-test inflated false claims instead):

    Var(c'mu_hat) = sum_j W_j sigma_j^2,   W_j = sum_{runs i of cell j} l_i^2,
    sigma_j^2 estimated by s_j^2 = sum_{i in j} res_i^2 / nu_j,   nu_j = sum_{i in j} (1 - h_ii)

(h_ii the leverage of run i in the cells + seeds model: the HC2 correction pooled within the
cell; it is statsmodels' per-run HC2 where a cell's runs share one leverage, as without seed
blocks or in a balanced design, and 1.7-6.5% off it with seed blocks and runs missing), on
Welch-Satterthwaite df (sum_j W_j s_j^2)^2 / sum_j (W_j s_j^2)^2 / nu_j. Without seed blocks
this is exactly Welch's t (W_j = c_j^2 / n_j, nu_j = n_j - 1). s_j^2 is unbiased when the
variances are equal; when they are not, a cell's estimate also picks up about
sum_k sigma_k^2 / m^2 through the estimated seed effects (balanced design: E s_j^2 =
sigma_j^2 (1 - 1/m) + sum_{k != j} sigma_k^2 / (m^2 (1 - 1/m))), 6% of a quiet cell's variance
when 4 of 32 cells have 3x its sd: slightly wide for the quiet cells, 3% short for the noisy
ones. For a balanced design and a
statistic that weighs every cell alike (a factorial effect) the SE equals the pooled one; only
the df are fewer. A cell with one run (nu_j = 0) has no variance of its own and takes the pooled
residual variance (residual df); ``se_method`` stays ``welch``. One run per cell: no residual df;
full and regular fractional designs then take the noise from Lenth's pseudo standard error (see
``effects``), method ``lenth``.

Everything is exact arithmetic (no resampling): the same table gives the same intervals.

Cost (up to MAX_FACTORS = 12 factors, m = 4,096 cells): G is diagonal without seed blocks and
with balanced seeds (every cell runs each seed equally often), and then nothing is inverted or
multiplied by a dense m x m matrix: c G^-1 is elementwise (``times_g_inv``), so the 4,095
effects and 4,096 cells of a 2^12 factorial cost O(m^2), not O(m^3). Only an unbalanced seed
layout inverts G (one O(m^3) ``np.linalg.inv``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import sparse, stats
from scipy.sparse.csgraph import connected_components

WELCH, LENTH, NONE = "welch", "lenth", "none"
"""Where a statistic's SE comes from: the cells' own residual variances (Welch-Satterthwaite df),
Lenth's pseudo standard error (one run per cell), or nowhere (no interval)."""


@dataclass(frozen=True)
class CellFit:
    """The fitted cell-means model of one metric."""

    masks: np.ndarray  # [m] observed cells (bitmasks), sorted
    n: np.ndarray  # [m] runs per cell
    raw_mean: np.ndarray  # [m] plain mean over the cell's runs
    sd: np.ndarray  # [m] sd over the cell's runs (ddof=1; NaN for one run)
    mu: np.ndarray  # [m] estimated cell means (seed-adjusted when blocked)
    g_inv: np.ndarray  # [m, m] Var(mu_hat) = sigma2 * g_inv under equal variances
    sigma2: float  # pooled residual mean square (NaN without residual df)
    df: float  # residual degrees of freedom
    blocked: bool  # seeds entered as blocks
    n_seeds: int
    seed_sd: float  # sd of the estimated seed effects b_s (NaN unless blocked)
    mean_inv_r: float  # mean over seeds of 1 / runs of the seed (NaN unless blocked)
    cell_var: np.ndarray  # [m] s_j^2, the cell's own residual variance (NaN where nu_j = 0)
    cell_df: np.ndarray  # [m] nu_j, the residual df the cell carries (sum of 1 - leverage)
    cell_index: np.ndarray  # [runs] position of each run's cell in masks
    seed_index: np.ndarray  # [runs] 0..n_seeds-1
    y: np.ndarray  # [runs]
    g_inv_diagonal: np.ndarray | None = None  # [m] diag(G^-1) when G is diagonal (no seed blocks, or balanced seeds)
    g: np.ndarray | None = field(default=None, repr=False)  # [m, m] G of the seed blocks (None when diagonal)

    def information(self) -> np.ndarray:
        """G [m, m], the information matrix of the cell means (g_inv's inverse), without inverting."""
        if self.g is not None:
            return self.g
        if self.g_inv_diagonal is not None:
            return np.diag(1.0 / self.g_inv_diagonal)
        return np.linalg.inv(self.g_inv)


def _connected(cell_index: np.ndarray, seed_index: np.ndarray, m: int, s: int) -> bool:
    """Whether the bipartite graph cells - seeds (edge: a run) is connected."""
    graph = sparse.coo_matrix(
        (np.ones(len(cell_index)), (cell_index, m + seed_index)), shape=(m + s, m + s)
    ).tocsr()
    count, _ = connected_components(graph, directed=False)
    return count == 1


def _seed_counts(cell_index, seed_index, m: int, s: int) -> tuple[sparse.csr_matrix, np.ndarray]:
    """(N [m, S] runs per cell and seed, r [S] runs per seed)."""
    counts = sparse.coo_matrix((np.ones(len(cell_index)), (cell_index, seed_index)), shape=(m, s)).tocsr()
    return counts, np.bincount(seed_index, minlength=s).astype(float)


def _blocked_system(cell_index, seed_index, y, m: int, s: int):
    """(G, A'My) of the within-seed form; see the module docstring."""
    counts, r = _seed_counts(cell_index, seed_index, m, s)
    seed_sums = np.bincount(seed_index, weights=y, minlength=s)
    n = np.bincount(cell_index, minlength=m).astype(float)
    cell_sums = np.bincount(cell_index, weights=y, minlength=m)
    scaled = counts.multiply(1.0 / r).tocsr()  # N diag(1/r)
    q = np.asarray(scaled.sum(axis=1)).ravel()
    inv_r = float(np.sum(1.0 / r))
    g = np.diag(n) - (scaled @ counts.T).toarray() + np.outer(q, q) / inv_r
    rhs = cell_sums - scaled @ seed_sums + q * float(np.sum(seed_sums / r)) / inv_r
    return g, rhs


def _diagonal(g: np.ndarray) -> np.ndarray | None:
    """diag(G) when G is diagonal up to rounding, else None. A balanced design (every cell runs
    every seed once, or equally often) has N = c 11' and r = c m, so G = diag(n) exactly; its
    inverse is then 1 / diag(G), with no O(m^3) inversion (4,096 cells: seconds, not minutes)."""
    diagonal = np.diagonal(g)
    scale = float(np.abs(diagonal).max()) if len(diagonal) else 0.0
    off_diagonal = np.count_nonzero(np.abs(g) > 1e-12 * scale) - np.count_nonzero(np.abs(diagonal) > 1e-12 * scale)
    return diagonal.copy() if off_diagonal == 0 and np.all(diagonal > 0) else None


def times_g_inv(fit: "CellFit", contrasts: np.ndarray) -> np.ndarray:
    """c G^-1 for each row c of ``contrasts`` [q, m] -> [q, m]: elementwise when G is diagonal
    (O(q m)), else a matrix product (O(q m^2))."""
    if fit.g_inv_diagonal is not None:
        return contrasts * fit.g_inv_diagonal
    m = len(fit.mu)
    if contrasts.shape == (m, m) and np.count_nonzero(contrasts) == m and np.all(np.diagonal(contrasts) == 1):
        return fit.g_inv.copy()  # the cells themselves (the cells table): I G^-1, without an O(m^3) product
    return contrasts @ fit.g_inv


def quadratic_forms(fit: "CellFit", contrasts: np.ndarray) -> np.ndarray:
    """c' G^-1 c for each row c of ``contrasts`` [q, m] -> [q] (Var(c'mu_hat) / sigma^2)."""
    contrasts = np.atleast_2d(contrasts)
    return np.einsum("ij,ij->i", times_g_inv(fit, contrasts), contrasts)


def _leverage(g_inv, g_inv_diagonal, cell_index, seed_index, n, blocked: bool) -> np.ndarray:
    """h_ii of every run in the cells (+ seeds) model.

    Blocked: H = P_seeds + MA (A'MA)^- A'M, and row i of MA is z_i = e_cell - N[:, seed] / r_seed,
    so h_ii = 1 / r_s + z_i' G^-1 z_i (G^-1 is a generalised inverse of A'MA, which is all the
    quadratic form needs). One-way layout: h_ii = 1 / n_cell.
    """
    if not blocked:
        return 1.0 / n[cell_index]
    counts, r = _seed_counts(cell_index, seed_index, len(n), int(seed_index.max()) + 1)
    if g_inv_diagonal is not None:
        gn, diagonal = counts.multiply(g_inv_diagonal[:, None]).toarray(), g_inv_diagonal  # [m, S] = G^-1 N
    else:
        gn, diagonal = np.asarray(counts.T @ g_inv).T, np.diag(g_inv)
    quad = np.asarray(counts.multiply(gn).sum(axis=0)).ravel()  # N[:, s]' G^-1 N[:, s]
    rs = r[seed_index]
    return 1.0 / rs + diagonal[cell_index] - 2 * gn[cell_index, seed_index] / rs + quad[seed_index] / rs**2


def _inverse(g: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(G^-1, diag(G^-1) when G is diagonal, G when it is not): the O(m^3) inversion only for a
    G that needs it (``_diagonal``)."""
    diagonal = _diagonal(g)
    if diagonal is not None:
        return np.diag(1.0 / diagonal), 1.0 / diagonal, None
    return np.linalg.inv(g), None, g


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
        g_inv, g_inv_diagonal, g = _inverse(g)
        mu = g_inv_diagonal * rhs if g_inv_diagonal is not None else g_inv @ rhs
        partial = y - mu[cell_index]
        b = np.bincount(seed_index, weights=partial, minlength=s) / np.bincount(seed_index, minlength=s)
        residual = partial - b[seed_index]
        df = len(y) - m - (s - 1)
        seed_sd = float(np.std(b, ddof=1))
        mean_inv_r = float(np.mean(1.0 / np.bincount(seed_index, minlength=s)))
    else:
        g_inv, g_inv_diagonal, g, mu = np.diag(1.0 / n), 1.0 / n, None, raw_mean
        residual = y - mu[cell_index]
        df, seed_sd, mean_inv_r = len(y) - m, float("nan"), float("nan")
    sse = float(residual @ residual)
    sigma2 = sse / df if df > 0 else float("nan")
    sq = np.bincount(cell_index, weights=(y - raw_mean[cell_index]) ** 2, minlength=m)
    free = 1.0 - _leverage(g_inv, g_inv_diagonal, cell_index, seed_index, n, blocked)
    cell_df = np.bincount(cell_index, weights=np.clip(free, 0.0, None), minlength=m)
    cell_df = np.where(cell_df > 1e-9, cell_df, 0.0)  # a one-run cell: h = 1 up to rounding
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.where(n > 1, np.sqrt(sq / np.maximum(n - 1, 1)), np.nan)
        cell_var = np.where(cell_df > 0, np.bincount(cell_index, weights=residual**2, minlength=m) / cell_df, np.nan)
    return CellFit(
        masks=masks, n=n, raw_mean=raw_mean, sd=sd, mu=mu, g_inv=g_inv, sigma2=sigma2,
        df=float(max(df, 0)), blocked=blocked, n_seeds=s, seed_sd=seed_sd, mean_inv_r=mean_inv_r,
        cell_var=cell_var, cell_df=cell_df, cell_index=cell_index, seed_index=seed_index, y=y,
        g_inv_diagonal=g_inv_diagonal, g=g,
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
    method: np.ndarray  # WELCH | LENTH | NONE per statistic


@dataclass(frozen=True)
class Noise:
    """Where the noise level comes from: the cells' own residual variances (WELCH), Lenth's PSE
    with one run per cell (LENTH: sigma2 and df are its variance and d), or nowhere (NONE).
    With WELCH, sigma2 and df are the pooled residual mean square and df (descriptive only)."""

    sigma2: float
    df: float
    method: str


def cell_weights(fit: CellFit, contrasts: np.ndarray) -> np.ndarray:
    """W [q, m]: W_j = sum over the runs of cell j of l_i^2, with l the run weights of each row's
    estimate c'mu_hat = l'y (module docstring); for a contrast sum_j W_j = c'G^-1 c.

    With u = G^-1 c, a run of cell j and seed s has l = u_j - v_s (v_s = 0 without seed blocks),
    v_s = (N'u)_s / r_s - q'u / (kappa r_s) (the second part moves levels only: q'u = 0 for a
    contrast), so W_j = n_j u_j^2 - 2 u_j (N v)_j + (N v^2)_j: sparse products, no runs x q array.
    """
    u = times_g_inv(fit, np.atleast_2d(contrasts))  # [q, m]
    weights = u * u
    weights *= fit.n
    if fit.blocked:
        counts, r = _seed_counts(fit.cell_index, fit.seed_index, len(fit.mu), fit.n_seeds)
        q, kappa = np.asarray(counts @ (1.0 / r)).ravel(), float(np.sum(1.0 / r))
        if len(fit.mu) * fit.n_seeds <= DENSE_COUNTS:  # BLAS on a small [m, S]; every [q, m] stays row-major
            counts = counts.toarray()
            times_n, times_n_t = (lambda x: x @ counts), (lambda x: x @ counts.T)
        else:
            times_n, times_n_t = (lambda x: (counts.T @ x.T).T), (lambda x: np.ascontiguousarray((counts @ x.T).T))
        v = times_n(u)  # [q, S]: u'N, then v
        v -= (u @ q)[:, None] / kappa
        v /= r
        u *= times_n_t(v)  # [q, m]: u N v (u is not needed after this)
        u *= 2.0
        weights -= u
        v *= v
        weights += times_n_t(v)
    return np.maximum(weights, 0.0, out=weights)  # a sum of squares; the expansion can round below zero


DENSE_COUNTS = 2**22
"""cell_weights holds the cells x seeds counts N dense up to this many entries (32 MB)."""


def welch_se(fit: CellFit, contrasts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(SE, Welch-Satterthwaite df) of each contrast row from the cells' own variances; a cell
    without residual df of its own counts with the pooled variance and the residual df."""
    own = fit.cell_df > 0
    var = np.where(own, fit.cell_var, fit.sigma2)
    nu = np.where(own, fit.cell_df, fit.df)
    parts = cell_weights(fit, contrasts)  # [q, m], then W_j s_j^2 in place
    parts *= var
    total = parts.sum(axis=1)
    squares = np.multiply(parts, parts, out=parts)
    with np.errstate(invalid="ignore", divide="ignore"):
        squares = np.divide(squares, nu, out=squares, where=squares > 0)  # 0 where a cell has no weight
        df = total**2 / squares.sum(axis=1)
    return np.sqrt(total), np.where(total > 0, df, np.inf)


def estimate(fit: CellFit, contrasts: np.ndarray, noise: Noise, confidence: float) -> Estimates:
    """Estimates of the statistics c_j'mu, one per row of ``contrasts`` [q, m].

    Rows with a NaN (a statistic needing a cell the design lacks) give NaN throughout.
    """
    contrasts = np.atleast_2d(np.asarray(contrasts, dtype=float))
    valid = ~np.isnan(contrasts).any(axis=1)
    c = contrasts if valid.all() else np.where(valid[:, None], contrasts, 0.0)
    point = np.where(valid, c @ fit.mu, np.nan)
    if noise.method == WELCH:
        se, df = welch_se(fit, c)
    elif noise.method == LENTH:
        se = np.sqrt(noise.sigma2 * quadratic_forms(fit, c))
        df = np.full(len(c), noise.df)
    else:
        se, df = np.full(len(c), np.nan), np.full(len(c), np.nan)
    method = np.array([noise.method] * len(c), dtype=object)
    se = np.where(valid, se, np.nan)
    return _intervals(point, se, df, method, confidence)


def estimate_over_new_seeds(
    fit: CellFit, contrasts: np.ndarray, noise: Noise, confidence: float, fixed: Estimates | None = None
) -> Estimates:
    """Levels (sum c != 0, e.g. a cell mean) with the seed effect counted as random: what a rerun
    with new seeds would average. Var = Var_these_seeds + (sum c)^2 sigma_b^2 / S, with sigma_b^2 =
    var(b_hat) - MSE mean(1/r_s) (the seed effects' spread beyond their own noise; MSE is the
    average run variance, which is what b_hat averages over), Satterthwaite df from the parts
    (S - 1 df for var(b_hat)); a non-positive sigma_b^2 estimate leaves the interval for these
    seeds as it is. Without seed blocks the seed effect is already in the noise. ``fixed``: the
    same contrasts' ``estimate`` when the caller has it (it is not computed again)."""
    fixed = estimate(fit, contrasts, noise, confidence) if fixed is None else fixed
    if not fit.blocked or noise.method != WELCH or not np.isfinite(fit.seed_sd):
        return fixed
    c = np.nan_to_num(np.atleast_2d(contrasts))
    total = c.sum(axis=1) ** 2 / fit.n_seeds
    seed_part = total * fit.seed_sd**2
    noise_part = fixed.se**2 - total * fit.sigma2 * fit.mean_inv_r
    random = seed_part > total * fit.sigma2 * fit.mean_inv_r  # sigma_b^2 estimate > 0
    var = seed_part + noise_part
    with np.errstate(invalid="ignore", divide="ignore"):
        df = var**2 / (seed_part**2 / max(fit.n_seeds - 1, 1) + np.maximum(noise_part, 0) ** 2 / fixed.df)
    se = np.sqrt(np.where(random, var, fixed.se**2))  # var > fixed.se^2 > 0 where random
    df = np.where(random, df, fixed.df)
    return _intervals(fixed.estimate, se, df, fixed.method, confidence)


def t_quantile(level: float, df) -> np.ndarray:
    """t_{level, df} (NaN where df <= 0; the normal quantile for infinite df)."""
    df = np.asarray(df, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.where(df > 0, stats.t.ppf(level, np.where(df > 0, df, 1.0)), np.nan)


def _intervals(point, se, df, method, confidence: float) -> Estimates:
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (df > 0) & (se > 0) & np.isfinite(se)
        quantile = np.where(ok, t_quantile(0.5 + confidence / 2, np.where(ok, df, 1)), np.nan)
        half = quantile * se
        p = np.where(ok, 2 * stats.t.sf(np.abs(point) / np.where(ok, se, 1), np.where(ok, df, 1)), np.nan)
    half = np.where(ok | (se == 0), np.where(se == 0, 0.0, half), np.nan)
    method = np.where(np.isnan(se), NONE, method)
    return Estimates(point, se, df, point - half, point + half, p, method)
