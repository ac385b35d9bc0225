"""Sampling distribution of the cell means: bootstrap over seeds, and the intervals built on it.

Method (what every CI in the reports means):

1. Seeds are the resampling unit. Cells are grouped by their set of seeds; cells with the same
   seeds are *paired*: one resample of seed indices per replicate is applied to all of them, so
   a seed that helps every cell (same data order, same init) cancels out of differences between
   cells. Cells with different seed sets are resampled independently of each other.
2. Each replicate's cell means are rescaled around the observed means by sqrt(n / (n - 1)),
   n the cell's seed count, which removes the plug-in bootstrap's variance bias (n-1)/n
   (Hesterberg 2015, "expanded" bootstrap).
3. A statistic (any function of the 2^k cell means: a Shapley value, a gain, a cumulative row)
   is evaluated on the observed means and on every replicate; its standard error is the
   standard deviation over replicates, and the interval is  estimate +- t_{1-a/2, df} * SE,
   with df = sum over seed groups of (seeds - 1).

Why not percentile intervals: RL ablations afford 3-5 seeds, and with 3 seeds the resampled
means take only 10 distinct values, so percentile intervals cover far less than 95%. For a
statistic linear in the cell means and paired seeds, steps 1-3 give the paired t-interval,
exact under normal noise (benchmarks/report_coverage.py measures the coverage).

With a single seed per cell there is nothing to resample. For a full or regular fractional
design the noise is then estimated by Lenth's pseudo standard error of the factorial effects
(sigma = PSE * sqrt(N) / 2, df = m / 3 for m effects), and replicates are drawn from
N(mean, sigma^2) per cell (a parametric bootstrap); the report says so. Otherwise no interval.
Every draw comes from ``numpy.random.default_rng(seed)``: same input and seed, same intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from .table import SEED_COLUMN, cell_masks


@dataclass(frozen=True)
class CellSample:
    """Observed cell means and bootstrap replicates of them."""

    masks: np.ndarray  # [m] observed cells (bitmasks), sorted
    n: np.ndarray  # [m] runs (seeds) per cell
    means: np.ndarray  # [m] mean metric per cell
    sd: np.ndarray  # [m] standard deviation over seeds (ddof=1; NaN for one seed)
    replicates: np.ndarray  # [B, m] rescaled bootstrap replicates of the means
    df: float  # degrees of freedom of the t quantile; 0 means no interval
    method: str  # one sentence for the report


def _paired_replicates(values: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Paired bootstrap of the mean of cells sharing seeds.

    values [cells, n] -> replicates [B, cells]; each replicate draws n seed indices with
    replacement (multinomial counts W [B, n]) shared by all cells: mean* = W @ values.T / n,
    then rescaled: mean + sqrt(n / (n - 1)) * (mean* - mean).
    """
    cells, n = values.shape
    mean = values.mean(axis=1)
    if n < 2:
        return np.broadcast_to(mean, (n_boot, cells)).copy()
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)
    resampled = counts @ values.T / n
    return mean + np.sqrt(n / (n - 1)) * (resampled - mean)


def bootstrap_cells(
    results: pd.DataFrame, factors: list[str], metric: str, n_boot: int = 2000, seed: int = 0
) -> CellSample:
    """Cell means with paired-over-seeds bootstrap replicates (see the module docstring)."""
    rng = np.random.default_rng(seed)
    by_seed = results.assign(_mask=cell_masks(results, factors)).pivot(
        index="_mask", columns=SEED_COLUMN, values=metric
    )
    values = by_seed.to_numpy(dtype=float)  # [m cells, all seeds], NaN where a cell lacks a seed
    masks = by_seed.index.to_numpy(dtype=np.int64)
    present = ~np.isnan(values)
    patterns, group_of = np.unique(present, axis=0, return_inverse=True)

    replicates = np.empty((n_boot, len(masks)))
    df = 0
    for g, pattern in enumerate(patterns):  # cells with the same seeds are paired
        cells = np.flatnonzero(group_of.ravel() == g)
        replicates[:, cells] = _paired_replicates(values[np.ix_(cells, np.flatnonzero(pattern))], n_boot, rng)
        df += int(pattern.sum()) - 1

    n = present.sum(axis=1)
    means = np.nanmean(values, axis=1)
    sd = by_seed.std(axis=1, ddof=1).to_numpy(dtype=float)  # NaN for a single seed
    paired = any(
        pattern.sum() > 1 and (group_of.ravel() == g).sum() > 1 for g, pattern in enumerate(patterns)
    )
    method = (
        f"bootstrap over seeds ({n_boot} resamples"
        + (", paired across cells that share seeds" if paired else "")
        + f"), t interval with {df} df"
    )
    return CellSample(masks, n, means, sd, replicates, float(df), method)


def lenth_parametric(sample: CellSample, sigma: float, df: float, n_boot: int, seed: int) -> CellSample:
    """Single-seed fallback: replicates ~ N(mean_j, sigma^2 / n_j), sigma from Lenth's PSE."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((n_boot, len(sample.means))) * sigma / np.sqrt(sample.n)
    method = (
        "one seed per cell, so no error degrees of freedom: the noise level comes from Lenth's "
        f"pseudo standard error of the factorial effects (parametric bootstrap, t interval with {df:.0f} df), "
        "which assumes most effects are zero"
    )
    return CellSample(sample.masks, sample.n, sample.means, sample.sd, sample.means + noise, df, method)


def t_interval(
    estimate: np.ndarray, replicates: np.ndarray, df: float, confidence: float
) -> tuple[np.ndarray, np.ndarray]:
    """estimate +- t_{(1+confidence)/2, df} * sd(replicates over axis 0); NaN when df == 0.

    estimate [...], replicates [B, ...] -> (low [...], high [...]).
    """
    estimate = np.asarray(estimate, dtype=float)
    if df <= 0:
        nan = np.full(estimate.shape, np.nan)
        return nan, nan.copy()
    se = np.std(replicates, axis=0, ddof=1)
    half = stats.t.ppf(0.5 + confidence / 2, df) * se
    return estimate - half, estimate + half
