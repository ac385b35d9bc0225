"""Planning before spending: seeds per cell for a given power, per claims family and design.

For a balanced design with n seeds per cell and seeds as blocks, a statistic c'mu of the cell
means has SE = sigma sqrt(c'c / n) (m cells). The report takes each cell's own variance
(``inference``), so the df are Welch-Satterthwaite's, which with equal variances are
(sum c_j^2)^2 / sum c_j^4 x nu, nu = (n - 1)(m - 1) / m per cell: all (m - 1)(n - 1) residual df
for a statistic that weighs every cell alike (an effect), far fewer for one that leans on a few
cells (a Shapley value's four heaviest cells). The df the report estimates from the data are
lower still, so the power below is a little optimistic for the few-cell statistics. The report
claims a statistic when its family-adjusted p-value is below alpha; with one real effect among nulls, Holm's and
Benjamini-Hochberg's first step is the Bonferroni level alpha / (F tests_in_family) (F families),
so the power to claim a statistic whose true value is ``effect`` is

    P(|T| > t_{1 - level/2, df}),   T ~ noncentral t(df, effect / SE),

computed for the family's least precise statistic. Families are the report's (``claims``):
attribution (Shapley values; main effects below resolution V), interactions (two-factor
effects or alias chains), order (gain added last minus added first). The designs: the full 2^k
factorial and its half fraction with the highest resolution (I = all factors).

sigma comes from a pilot (the report's residual mean square, seeds as blocks) or is stated.

Bounded: at most MAX_FACTORS (12) factors, refused in one sentence before any work; the family
contrasts are built as contrast rows (no 2^k x 2^k identity, only effects up to order two), and
the seed count is found by bisection on the power (about 10 integrals per family, not one per
candidate n), so a 12-factor plan takes seconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import integrate, stats

from . import shapley as sv
from .analysis import fit_table, noise_model
from .design import DesignInfo, describe_design
from .effects import effect_contrasts, model_prediction_map
from .table import MAX_FACTORS, ReportInputError, validate_results

POWER_COLUMNS = [
    "design", "cells", "family", "statistic", "tests", "level", "se_one_seed", "seeds_per_cell", "runs", "power",
]  # fmt: skip
MAX_SEEDS = 1000


def half_fraction(k: int) -> np.ndarray:
    """Cells of the 2^(k-1) fraction I = (all factors): an even number of factors on."""
    cells = np.arange(2**k)
    return cells[sv.popcount(cells) % 2 == 0]


def family_contrasts(design: DesignInfo, factors: list[str]) -> dict[str, tuple[str, np.ndarray]]:
    """{family: (statistic, contrast rows over the observed cells)} as the report tests them.

    The rows are built as contrasts of the 2^k cell means (``shapley.shapley_matrix``, four cells
    per order gap) and mapped onto the observed cells: the full design's cells are its own, a
    resolution V+ fraction's come from the fitted model; only main effects and two-factor
    effects are formed (``max_order=2``), not all 2^k - 1."""
    m, k = len(design.observed), design.k
    if design.kind == "full":
        to_observed = lambda rows: rows  # noqa: E731 - the cells in mask order are the observed ones
    elif (design.resolution or 0) >= 5:
        value_map = model_prediction_map(design, np.eye(m))  # [2**k, m]
        to_observed = lambda rows: rows @ value_map  # noqa: E731
    else:
        to_observed = None
    effects = effect_contrasts(design, factors, np.eye(m), max_order=2)
    families: dict[str, tuple[str, np.ndarray]] = {}
    if to_observed is not None:
        families["attribution"] = ("Shapley value", to_observed(sv.shapley_matrix(k)))
    else:
        families["attribution"] = ("main effect", effects.contrasts[effects.orders == 1])
    families["interactions"] = ("two-factor interaction effect", effects.contrasts[effects.orders == 2])
    if to_observed is not None:
        families["order"] = ("gain added last minus first", to_observed(order_gap_matrix(k)))
    return {name: value for name, value in families.items() if len(value[1])}


def order_gap_matrix(k: int) -> np.ndarray:
    """[k, 2**k]: factor i's gain added last minus added first, v(all) - v(all - i) - v(i) + v(none)
    (``shapley.leave_one_out - shapley.add_one``), as contrast rows."""
    full, rows = 2**k - 1, np.zeros((k, 2**k))
    for i in range(k):
        for cell, sign in ((full, 1.0), (full ^ (1 << i), -1.0), (1 << i, -1.0), (0, 1.0)):
            rows[i, cell] += sign  # k = 1: all - i is none and i is all, so the row is zero
    return rows


def power_at(effect: float, se: float, df: float, level: float) -> float:
    """Two-sided power of a t test at ``level`` for a true value ``effect`` with this SE and df.

    The noncentral t tail, as an integral over the variance estimate: with W ~ chi2(df) and
    s = sqrt(W / df), P(|T| > c) = E[Phi(delta - c s) + Phi(-delta - c s)], delta = effect / SE
    (scipy's nct tails return NaN for some large shifts; this form does not).
    """
    critical, shift = stats.t.ppf(1 - level / 2, df), abs(effect) / se

    def integrand(w: float) -> float:
        s = np.sqrt(w / df)
        return (stats.norm.cdf(shift - critical * s) + stats.norm.cdf(-shift - critical * s)) * stats.chi2.pdf(w, df)

    low, high = stats.chi2.ppf([1e-12, 1 - 1e-12], df)
    value, _ = integrate.quad(integrand, low, high, limit=200)
    return float(min(max(value, 0.0), 1.0))


def welch_df(contrast: np.ndarray, m: int, n: int) -> float:
    """Welch-Satterthwaite df of c'mu with equal cell variances, n seeds per cell as blocks:
    (sum c^2)^2 / sum c^4 x (n - 1)(m - 1) / m.

    Example: an effect of the 2^5 (c = +-1/16 over 32 cells), n = 3: 32 x 2 x 31 / 32 = 62, the
    residual df; one cell against another (c = +-1), n = 3: 2 x 2 x 31 / 32 = 3.875.
    """
    c2 = np.asarray(contrast, dtype=float) ** 2
    return float(c2.sum() ** 2 / np.sum(c2**2) * (n - 1) * (m - 1) / m)


def seeds_needed(effect: float, sigma: float, contrast: np.ndarray, m: int, level: float, power: float) -> tuple[int, float]:
    """Smallest n in 2..MAX_SEEDS with power >= ``power`` (SE = sigma sqrt(c'c / n), df =
    ``welch_df``), else (MAX_SEEDS + 1, NaN). Power rises with n (the SE falls and the df grow),
    so bisection finds it with about log2(MAX_SEEDS) = 10 evaluations of ``power_at``, each a
    numerical integral, instead of one per candidate n."""
    unit = float(np.sum(np.asarray(contrast) ** 2))

    def achieved(n: int) -> float:
        return power_at(effect, sigma * np.sqrt(unit / n), welch_df(contrast, m, n), level)

    high_power = achieved(MAX_SEEDS)
    if high_power < power:
        return MAX_SEEDS + 1, float("nan")
    low, high = 1, MAX_SEEDS  # power(low) < wanted (or low below the range), power(high) >= wanted
    while high - low > 1:
        middle = (low + high) // 2
        value = achieved(middle) if middle >= 2 else 0.0
        if value >= power:
            high, high_power = middle, value
        else:
            low = middle
    return high, high_power


def plan_seeds(
    factors: list[str], sigma: float, effect: float, power: float = 0.8, alpha: float = 0.05, adjust: str = "holm"
) -> pd.DataFrame:
    """POWER_COLUMNS per design (full, half fraction) and family: seeds per cell for ``power``.
    ReportInputError, before any work, for more than MAX_FACTORS factors."""
    k = len(factors)
    if k > MAX_FACTORS:
        raise ReportInputError(
            f"plan-seeds got {k} factors, and a report analyses at most {MAX_FACTORS} ({2**MAX_FACTORS:,} cells; each "
            f"further factor doubles the cells to run); plan a design of {MAX_FACTORS} or fewer with --factors"
        )
    designs = [("full 2^%d" % k, np.arange(2**k))]
    if k >= 3:
        designs.append((f"half fraction 2^({k}-1)", half_fraction(k)))
    rows = []
    for name, cells in designs:
        design = describe_design(cells, k)
        families = family_contrasts(design, factors)
        for family, (statistic, contrasts) in families.items():
            tests = len(contrasts)
            level = alpha if adjust == "none" else alpha / (len(families) * tests)
            least = contrasts[int(np.argmax(np.sum(contrasts**2, axis=1)))]  # the family's least precise
            unit = float(np.sum(least**2))
            n, achieved = seeds_needed(effect, sigma, least, len(cells), level, power)
            rows.append(
                {
                    "design": name + (f" (resolution {design.resolution})" if design.kind == "fraction" else ""),
                    "cells": len(cells), "family": family, "statistic": statistic, "tests": tests,
                    "level": level, "se_one_seed": sigma * np.sqrt(unit), "seeds_per_cell": n,
                    "runs": n * len(cells), "power": achieved,
                }  # fmt: skip
            )
    return pd.DataFrame(rows, columns=POWER_COLUMNS)


def pilot_sigma(results: pd.DataFrame, factors: list[str], metric: str) -> tuple[float, str]:
    """(sigma, where it came from): the run noise sd of a pilot's results, seeds as blocks.

    Raises ReportInputError (via validation) for a bad table, and when the pilot has no
    residual degrees of freedom and no basis for Lenth's method.
    """
    results = validate_results(results, factors, metric)
    fit = fit_table(results, factors, metric)  # the report's own model, so plan and report agree
    design = describe_design(fit.masks, len(factors))
    noise, lenth = noise_model(fit, design, effect_contrasts(design, factors, fit.information()), 0.95)
    if not np.isfinite(noise.sigma2) or noise.sigma2 <= 0:
        raise ReportInputError(
            "the pilot results have no replicated cells and no basis for Lenth's method, so they give no noise "
            "level; run a second seed in some cells or pass --sd"
        )
    source = (
        f"Lenth's pseudo standard error of the pilot's {lenth['m']} effects (one seed per cell)"
        if lenth
        else f"the pilot's residual ({fit.df:.0f} df, seeds {'as blocks' if fit.blocked else 'not shared'})"
    )
    return float(np.sqrt(noise.sigma2)), source
