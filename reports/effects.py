"""Factorial effects by OLS with -1/+1 coding, Lenth's method, and fitted-model cell means.

Coding x_i = 2 * level_i - 1; a term's column is the product of its factors' columns. The
effect of a term is 2 * its OLS coefficient: for a main effect in a balanced design, the mean
of the runs with the factor on minus the mean with it off. The model fitted holds every term
the observed cells can separate (saturated in the cells), so the residuals are pure
replication error; when seeds are shared by every cell, seed dummies are added as blocks.
The table reports main effects and two-factor interactions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import stats

from .design import DesignInfo, Term, all_terms, contrast_column, term_name
from .table import SEED_COLUMN, cell_masks

EFFECT_COLUMNS = ["term", "effect", "se", "ci_low", "ci_high", "p_value"]


@dataclass(frozen=True)
class EffectsFit:
    """Effects table plus what the single-seed fallback and the report need."""

    table: pd.DataFrame  # EFFECT_COLUMNS; main effects and two-factor interactions
    all_effects: pd.DataFrame  # every fitted term, same columns plus "order"
    method: str  # one sentence for the report
    lenth_sigma: float | None  # per-run noise sd implied by Lenth's PSE (single seed), else None
    lenth_df: float | None


def lenth_pse(effects: np.ndarray) -> float:
    """Lenth's (1989) pseudo standard error of unreplicated factorial effects.

    s0 = 1.5 * median|c_j|;  PSE = 1.5 * median{ |c_j| : |c_j| < 2.5 * s0 }.
    Example: c = (10, -1, 2, .5, -.2, 1.5, .3): median|c| = 1, s0 = 1.5, the trimmed set drops
    10, its median is (.5 + 1) / 2 = .75, so PSE = 1.125.
    """
    magnitudes = np.abs(np.asarray(effects, dtype=float))
    s0 = 1.5 * np.median(magnitudes)
    return float(1.5 * np.median(magnitudes[magnitudes < 2.5 * s0]))


def fitted_terms(design: DesignInfo) -> list[Term]:
    """Terms the observed cells can separate: all for a full design, one per alias group for a
    fraction, main effects (plus two-factor interactions when estimable) for an incomplete one."""
    if design.kind == "full":
        return all_terms(design.k)
    if design.kind == "fraction":
        return [group[0] for group in design.alias_groups]
    masks = np.array(design.observed)
    for order in (2, 1):
        terms = all_terms(design.k, order)
        x = np.column_stack([np.ones(len(masks))] + [contrast_column(masks, t) for t in terms])
        if np.linalg.matrix_rank(x) == x.shape[1]:
            return terms
    return []


def _is_blocked(results: pd.DataFrame, factors: list[str]) -> bool:
    """Seeds are blocks when there are >= 2 and every observed cell ran every seed."""
    seeds = set(results[SEED_COLUMN])
    per_cell = results.assign(_m=cell_masks(results, factors)).groupby("_m")[SEED_COLUMN].apply(set)
    return len(seeds) > 1 and all(s == seeds for s in per_cell)


def _design_matrix(results: pd.DataFrame, factors: list[str], terms: list[Term], blocked: bool) -> np.ndarray:
    masks = cell_masks(results, factors)
    columns = [np.ones(len(results))] + [contrast_column(masks, t) for t in terms]
    if blocked:
        seeds = sorted(set(results[SEED_COLUMN]))
        columns += [(results[SEED_COLUMN] == s).to_numpy(float) for s in seeds[1:]]
    return np.column_stack(columns)


def _table(terms, factors, effect, se, df, confidence, p_value=None) -> pd.DataFrame:
    half = stats.t.ppf(0.5 + confidence / 2, df) * se if df and df > 0 else np.full(len(terms), np.nan)
    if p_value is None:
        p_value = 2 * stats.t.sf(np.abs(effect / se), df) if df and df > 0 else np.full(len(terms), np.nan)
    return pd.DataFrame(
        {
            "term": [term_name(t, factors) for t in terms],
            "effect": effect,
            "se": se,
            "ci_low": effect - half,
            "ci_high": effect + half,
            "p_value": p_value,
            "order": [len(t) for t in terms],
        }
    )


def factorial_effects(
    results: pd.DataFrame, factors: list[str], metric: str, design: DesignInfo, confidence: float = 0.95
) -> EffectsFit:
    """Effects (2 x OLS coefficient), SE, t-interval and p-value per term (statsmodels OLS).

    With no residual degrees of freedom (one seed per cell) in a full or regular fractional
    design, the SE of every effect is Lenth's PSE with m/3 df, m the number of fitted effects.
    """
    terms = fitted_terms(design)
    if not terms:
        empty = pd.DataFrame(columns=EFFECT_COLUMNS)
        return EffectsFit(empty, empty, "The observed cells cannot separate the main effects.", None, None)
    blocked = _is_blocked(results, factors)
    fit = sm.OLS(results[metric].to_numpy(float), _design_matrix(results, factors, terms, blocked)).fit()
    effect = 2 * np.asarray(fit.params)[1 : len(terms) + 1]
    lenth_sigma = lenth_df = None
    if fit.df_resid > 0:
        se = 2 * np.asarray(fit.bse)[1 : len(terms) + 1]
        p = np.asarray(fit.pvalues)[1 : len(terms) + 1]
        table = _table(terms, factors, effect, se, fit.df_resid, confidence, p)
        method = (
            f"OLS with -1/+1 coding, effect = 2 x coefficient, t interval with {fit.df_resid:.0f} residual df"
            + (" (seeds as blocks)" if blocked else "")
            + (
                ""
                if design.kind != "incomplete"
                else "; incomplete design, so interactions beyond those fitted are assumed zero"
            )
        )
    elif design.kind in ("full", "fraction") and len(terms) >= 3:
        pse = lenth_pse(effect)
        lenth_df = len(terms) / 3
        lenth_sigma = pse * np.sqrt(len(results)) / 2  # SE(effect) = 2 sigma / sqrt(N)
        table = _table(terms, factors, effect, np.full(len(terms), pse), lenth_df, confidence)
        method = (
            f"one seed per cell, so no error degrees of freedom: SEs are Lenth's pseudo standard error "
            f"(PSE = {pse:.4g}, {lenth_df:.1f} df), which assumes most of the {len(terms)} effects are zero"
        )
    else:
        table = _table(terms, factors, effect, np.full(len(terms), np.nan), 0, confidence)
        method = "No residual degrees of freedom and no basis for Lenth's method: effects have no SE."
    return EffectsFit(
        table[table["order"] <= 2][EFFECT_COLUMNS].reset_index(drop=True),
        table,
        method,
        lenth_sigma,
        lenth_df,
    )


def model_prediction_map(design: DesignInfo, n: np.ndarray, max_order: int = 2) -> np.ndarray:
    """Linear map from observed cell means to all 2^k cell means under the fitted model.

    Model: intercept + fitted terms of order <= max_order; weighted least squares on cell means
    with weights n_j (equal to OLS on the runs). P = X_all (X' W X)^-1 X' W, shape [2**k, m],
    so predicted = P @ observed means (and the same for each bootstrap replicate).
    """
    terms = [t for t in fitted_terms(design) if len(t) <= max_order]
    observed = np.array(design.observed)
    everything = np.arange(2**design.k)
    x_obs = np.column_stack([np.ones(len(observed))] + [contrast_column(observed, t) for t in terms])
    x_all = np.column_stack([np.ones(len(everything))] + [contrast_column(everything, t) for t in terms])
    weighted = x_obs.T * n
    return x_all @ np.linalg.solve(weighted @ x_obs, weighted)
