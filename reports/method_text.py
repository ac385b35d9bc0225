"""The report's method lines and notes, in words: how its intervals were made (`ci_method`), what
an effect is (`effects_method`), where the values over all cells come from (`values_source`), and
the notes on the design and the seeds. Text only, from the parts of one analysis (`analysis.analyze`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .design import DesignInfo, roman
from .effects import EffectContrasts
from .inference import LENTH, NONE, CellFit, Noise
from .orderings import path_masks
from .table import describe_cell


def df_range(intervals: pd.DataFrame) -> str:
    """The df the report's intervals use, as read from intervals.csv: "3.0" or "from 1.2 to 7.4"."""
    df = pd.to_numeric(intervals["df"], errors="coerce").dropna() if "df" in intervals else pd.Series(dtype=float)
    df = df[np.isfinite(df)]
    if df.empty:
        return "none"
    low, high = float(df.min()), float(df.max())
    return f"{low:.1f}" if abs(high - low) < 0.05 else f"from {low:.1f} to {high:.1f}"


def ci_method(fit: CellFit, noise: Noise, lenth: dict | None, intervals: pd.DataFrame) -> str:
    if noise.method == NONE:
        return "one run per cell and no basis for Lenth's method: no intervals"
    if noise.method == LENTH:
        return (
            "one run per cell, so no residual degrees of freedom: the noise level comes from Lenth's pseudo "
            f"standard error of the {lenth['m']} factorial effects (PSE {lenth['pse']:.4g}, t with {lenth['d']:.1f} df), "
            "which assumes most effects are zero; every statistic c'mu has SE sqrt(sigma^2 c'G^-1 c)"
        )
    blocks = "with seeds as blocks" if fit.blocked else "without seed blocks (the cells do not share seeds)"
    return (
        f"t intervals from the cell-means model {blocks}; each statistic c'mu has its SE from every cell's own "
        "residual variance (sum_j W_j s_j^2) and its own Welch-Satterthwaite df (here "
        f"{df_range(intervals)}; se and df of each in intervals.csv), so a noisier cell widens exactly the "
        "statistics that lean on it; no resampling, no pre-test"
    )


def effects_method(design: DesignInfo, effects: EffectContrasts, noise: Noise) -> str:
    if not effects.names:
        return (
            "the observed cells cannot separate main effects from interactions, so no factorial effects are "
            "reported; gains between observed cells are path gains (cumulative.csv, claims of kind step)"
        )
    df = (f"Lenth's df ({noise.df:.1f}) for every effect" if noise.method == LENTH
          else "each with its own SE and Welch-Satterthwaite df (effects.csv: se, df)")
    text = f"effect = mean of the +1 cells minus mean of the -1 cells (2 x OLS coefficient, -1/+1 coding), {df}"
    if design.kind == "fraction":
        text += "; aliased terms are named as their whole chain (a:b = c:d), never one member alone"
    if effects.model_based:
        text += (
            "; incomplete design: effects come from a model with main effects and two-factor interactions, "
            "assuming higher-order interactions are zero (intervals use replication error only)"
        )
    return text


def values_source(design: DesignInfo) -> str:
    if design.kind == "full":
        return "cell means"
    if design.kind == "fraction" and (design.resolution or 0) >= 5:
        return "the fitted model (main effects + two-factor interactions; higher-order interactions assumed zero)"
    return "the observed cell means only (statistics that need an unobserved cell are not computed)"


def design_notes(design: DesignInfo, factors: list[str], point: np.ndarray, paths: list[tuple[str, list[str]]],
                 effects: EffectContrasts) -> list[str]:
    """What the report says about its design: a fraction's or an incomplete design's limits, and
    each ordering that lacks a cell (`point`: the 2^k cell values, NaN where not computed)."""
    notes = []
    if design.kind == "fraction" and (design.resolution or 0) >= 5:
        notes.append(
            f"Regular fraction: {len(design.observed)} of {2**design.k} cells (resolution {roman(design.resolution)}). "
            "Shapley values, orderings, cumulative rows and leave-one-out come from the fitted model "
            "(main effects + two-factor interactions), assuming higher-order interactions are zero."
        )
    elif design.kind == "fraction":
        notes.append(
            f"Resolution {roman(design.resolution)} fraction ({len(design.observed)} of {2**design.k} cells): two-factor "
            "interactions are aliased with each other or with main effects, so Shapley values, orderings and the "
            "cells it did not run are not computed; each effect is named by its whole alias chain."
        )
    if design.kind == "incomplete":
        notes.append(
            f"Incomplete design: {len(design.observed)} of {2**design.k} cells; missing {design.missing_labels(factors)}. "
            "Shapley and Banzhaf values and order dependence need every cell (or a regular fraction) and are not computed."
        )
        if not effects.names:
            notes.append(
                "These cells cannot separate main effects from interactions: the gains between them are path gains "
                "(what adding a factor did at that point of the path), not main effects."
            )
        for name, path in paths:
            lacking = [m for m in path_masks(path, factors) if np.isnan(point[m])]
            if lacking:
                notes.append(
                    f"Ordering {name} lacks cell {describe_cell(int(lacking[0]), factors)}; the rows that need it are empty."
                )
    return notes


def seed_notes(fit: CellFit, percent: bool) -> list[str]:
    notes = []
    if fit.blocked and np.isfinite(fit.seed_sd):
        spread = f"{100 * fit.seed_sd:.1f} pp" if percent else f"{fit.seed_sd:.4g}"
        notes.append(
            "Cell means and their intervals (ci_low, ci_high) are for these seeds (seeds are blocks): the seed "
            f"effects spread with sd {spread}, so a rerun with new seeds may move every cell together; cells.csv's "
            "seed_ci_low/seed_ci_high count that in. Differences between cells (effects, gains, Shapley values) "
            "do not depend on it."
        )
    if fit.n_seeds >= 2 and not fit.blocked and (fit.n > 1).any():
        notes.append(
            "The cells do not share seeds, so seed-to-seed variation stays in the noise (no seed blocks); "
            "numbering seeds the same way in every cell would pair the cells and narrow the intervals."
        )
    return notes
