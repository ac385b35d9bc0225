"""One analysis of a results table: every report table, with intervals, as pandas DataFrames.

Steps: validate the table -> read the design from its cells -> bootstrap the cell means over
seeds -> fit the factorial effects -> express all 2^k cell means (observed, or from the fitted
model for a fraction, NaN where an incomplete design lacks them) -> evaluate each statistic on
the point estimates and on every replicate -> t intervals (see ``bootstrap``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import factorial
from typing import Callable

import numpy as np
import pandas as pd
from scipy import stats

from . import shapley as sv
from .bootstrap import CellSample, bootstrap_cells, lenth_parametric, t_interval
from .compute import compute_table
from .design import DesignInfo, describe_design, require_design, term_name
from .effects import EffectsFit, factorial_effects, model_prediction_map
from .orderings import cumulative_means, path_masks, position_means, position_summary, resolve_orderings
from .table import PAPER_AIME_AVG32, cell_label, cell_masks, describe_cell, validate_results

Statistic = Callable[[np.ndarray], np.ndarray]  # [..., 2**k] -> [..., out]


@dataclass
class Analysis:
    """Everything a report shows. Metric values are stored as given (fractions for accuracy)."""

    factors: list[str]
    metric: str
    confidence: float
    design: DesignInfo
    n_runs: int
    cells: pd.DataFrame
    cumulative: pd.DataFrame
    orderings: pd.DataFrame
    shapley: pd.DataFrame
    effects: pd.DataFrame
    leave_one_out: pd.DataFrame
    compute: pd.DataFrame
    order_gaps: pd.DataFrame  # factor, first, last, gap (last - first), ci_low, ci_high
    ci_method: str
    effects_method: str
    values_source: str  # where the 2^k cell means behind Shapley and orderings come from
    all_effects: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    shapley_check: dict | None = None  # {"sum", "full", "baseline", "ok"}
    aliases: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    percent: bool = True  # metric in [0, 1]: display as percentage points
    paper_reference: tuple[int, ...] | None = None  # shown beside the `paper` ordering


class CellValues:
    """All 2^k cell means as a linear function of the observed ones, with intervals."""

    def __init__(self, sample: CellSample, design: DesignInfo, confidence: float):
        self.sample, self.confidence, k = sample, confidence, design.k
        m = len(sample.masks)
        self.missing = np.ones(2**k, dtype=bool)
        if design.kind == "fraction":
            self.map = model_prediction_map(design, sample.n)  # [2**k, m]
            self.missing[:] = False
        else:  # observed cells in place; missing ones become NaN
            self.map = np.zeros((2**k, m))
            self.map[sample.masks, np.arange(m)] = 1.0
            self.missing[sample.masks] = False
        self.point = self._expand(sample.means)
        self.replicates = self._expand(sample.replicates)

    def _expand(self, means: np.ndarray) -> np.ndarray:
        """[..., m] observed cell means -> [..., 2**k] all cell means (NaN where missing)."""
        values = means @ self.map.T
        values[..., self.missing] = np.nan
        return values

    def summarize(self, statistic: Statistic) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimate, ci_low, ci_high) of a statistic of the cell means."""
        estimate = statistic(self.point)
        low, high = t_interval(estimate, statistic(self.replicates), self.sample.df, self.confidence)
        return estimate, low, high


def _cells_table(sample: CellSample, factors: list[str], confidence: float, lenth: bool) -> pd.DataFrame:
    """Per cell: n, mean, sd over seeds, and mean +- t_{n-1} * bootstrap SE (Lenth's df when one seed)."""
    se = np.std(sample.replicates, axis=0, ddof=1)
    df = np.full(len(sample.n), sample.df) if lenth else sample.n - 1.0
    with np.errstate(invalid="ignore"):
        half = np.where(df > 0, stats.t.ppf(0.5 + confidence / 2, np.maximum(df, 1)) * se, np.nan)
    return pd.DataFrame(
        {
            "cell": [cell_label(int(m), factors) for m in sample.masks],
            **{f: (sample.masks >> i) & 1 for i, f in enumerate(factors)},
            "n": sample.n,
            "mean": sample.means,
            "sd": sample.sd,
            "ci_low": sample.means - half,
            "ci_high": sample.means + half,
        }
    )


def _cumulative_table(
    values: CellValues, paths: list[tuple[str, list[str]]], factors: list[str]
) -> pd.DataFrame:
    rows = []
    for name, path in paths:
        masks = path_masks(path, factors)
        mean, mean_low, mean_high = values.summarize(lambda v: cumulative_means(v, masks)[0])
        delta, delta_low, delta_high = values.summarize(lambda v: cumulative_means(v, masks)[1])
        for step in range(len(masks)):
            rows.append(
                {
                    "ordering": name,
                    "step": step,
                    "added": path[step - 1] if step else "baseline",
                    "mean": mean[step],
                    "ci_low": mean_low[step],
                    "ci_high": mean_high[step],
                    "delta": delta[step],
                    "delta_ci_low": delta_low[step],
                    "delta_ci_high": delta_high[step],
                }
            )
    return pd.DataFrame(rows)


def _orderings_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    k, rows = len(factors), []
    if np.isnan(values.point).any():
        return pd.DataFrame(
            columns=[
                "factor",
                "position",
                "n_orderings",
                "mean",
                "ci_low",
                "ci_high",
                "min",
                "max",
                "share_positive",
            ]
        )
    for i, factor in enumerate(factors):
        summary = position_summary(values.point, i)
        mean, low, high = values.summarize(lambda v: position_means(v, i))
        for p in range(k + 1):
            rows.append(
                {
                    "factor": factor,
                    "position": str(p + 1) if p < k else "all",
                    "n_orderings": factorial(k - 1) if p < k else factorial(k),
                    "mean": mean[p],
                    "ci_low": low[p],
                    "ci_high": high[p],
                    "min": summary["min"][p],
                    "max": summary["max"][p],
                    "share_positive": summary["share_positive"][p],
                }
            )
    return pd.DataFrame(rows)


def _order_gap_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    """Per factor: mean gain when added last minus when added first, with CI.

    Non-zero exactly when the factor interacts with others: gain_last - gain_first =
    [v(all) - v(all - i)] - [v(i) - v(none)].
    """
    k = len(factors)
    gap, low, high = values.summarize(lambda v: sv.leave_one_out(v) - sv.add_one(v))
    first, _, _ = values.summarize(sv.add_one)
    return (
        pd.DataFrame(
            {
                "factor": factors,
                "first": first,
                "last": first + gap,
                "gap": gap,
                "ci_low": low,
                "ci_high": high,
            }
        )
        if k > 1
        else pd.DataFrame()
    )


def _shapley_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    phi, phi_low, phi_high = values.summarize(sv.shapley_values)
    beta, beta_low, beta_high = values.summarize(sv.banzhaf_values)
    return pd.DataFrame(
        {
            "factor": factors,
            "shapley": phi,
            "ci_low": phi_low,
            "ci_high": phi_high,
            "banzhaf": beta,
            "banzhaf_ci_low": beta_low,
            "banzhaf_ci_high": beta_high,
        }
    )


def _leave_one_out_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    loo, loo_low, loo_high = values.summarize(sv.leave_one_out)
    add, add_low, add_high = values.summarize(sv.add_one)
    return pd.DataFrame(
        {
            "factor": factors,
            "leave_one_out": loo,
            "loo_ci_low": loo_low,
            "loo_ci_high": loo_high,
            "add_one": add,
            "add_one_ci_low": add_low,
            "add_one_ci_high": add_high,
        }
    )


def _shapley_check(shapley: pd.DataFrame, values: CellValues) -> dict | None:
    """Efficiency: sum of Shapley values == v(all) - v(none), up to rounding."""
    if shapley["shapley"].isna().any():
        return None
    full, baseline = float(values.point[-1]), float(values.point[0])
    total = float(shapley["shapley"].sum())
    return {
        "sum": total,
        "full": full,
        "baseline": baseline,
        "ok": bool(np.isclose(total, full - baseline, atol=1e-9)),
    }


def _alias_lines(design: DesignInfo, factors: list[str]) -> list[str]:
    if design.kind != "fraction":
        return []
    lines = ["I = " + " = ".join(term_name(w, factors) for w in design.defining_words)]
    for group in design.alias_groups:
        if len(group[0]) <= 2 and len(group) > 1:
            lines.append(" = ".join(term_name(t, factors) for t in group))
    return lines


def _design_notes(design: DesignInfo, factors: list[str], values: CellValues, paths) -> list[str]:
    notes = []
    if design.kind == "fraction":
        notes.append(
            f"Regular fraction: {len(design.observed)} of {2**design.k} cells (resolution {design.resolution}). "
            "Shapley values, orderings, cumulative rows and leave-one-out come from the fitted model "
            "(main effects + two-factor interactions), assuming higher-order interactions are zero."
        )
    if design.kind == "incomplete":
        notes.append(
            f"Incomplete design: {len(design.observed)} of {2**design.k} cells; missing {design.missing_labels(factors)}. "
            "Shapley and Banzhaf values and order dependence need every cell (or a regular fraction) and are not computed."
        )
        for name, path in paths:
            lacking = [m for m in path_masks(path, factors) if np.isnan(values.point[m])]
            if lacking:
                notes.append(
                    f"Ordering {name} lacks cell {describe_cell(int(lacking[0]), factors)}; the rows that need it are empty."
                )
    return notes


def analyze(
    results: pd.DataFrame,
    factors: list[str],
    metric: str = "avg@32",
    orderings: str | list[list[str]] = "paper",
    confidence: float = 0.95,
    seed: int = 0,
    design: str | None = None,
    n_boot: int = 2000,
) -> Analysis:
    """Every report table for ``results`` (see the module docstring for the steps)."""
    factors = list(factors)
    results = validate_results(results, factors, metric)
    info = describe_design(cell_masks(results, factors), len(factors))
    require_design(info, design, factors)
    paths, notes = resolve_orderings(orderings, factors)

    sample = bootstrap_cells(results, factors, metric, n_boot, seed)
    effects: EffectsFit = factorial_effects(results, factors, metric, info, confidence)
    lenth = sample.df == 0 and effects.lenth_sigma is not None
    if lenth:
        sample = lenth_parametric(sample, effects.lenth_sigma, effects.lenth_df, n_boot, seed)
    elif sample.df == 0:
        notes.append("One seed per cell and no basis for Lenth's method: no confidence intervals.")
    if (sample.n == 1).any() and not lenth and sample.df > 0:
        notes.append(
            f"{int((sample.n == 1).sum())} cells have a single seed; their noise is missing from the intervals."
        )
    values = CellValues(sample, info, confidence)

    shapley = _shapley_table(values, factors)
    source = {"full": "cell means", "fraction": "fitted model (main effects + two-factor interactions)"}
    return Analysis(
        factors=factors,
        metric=metric,
        confidence=confidence,
        design=info,
        n_runs=len(results),
        cells=_cells_table(sample, factors, confidence, lenth),
        cumulative=_cumulative_table(values, paths, factors),
        orderings=_orderings_table(values, factors),
        shapley=shapley,
        effects=effects.table,
        leave_one_out=_leave_one_out_table(values, factors),
        compute=compute_table(results, factors, metric),
        order_gaps=_order_gap_table(values, factors),
        ci_method=sample.method,
        effects_method=effects.method,
        values_source=source.get(info.kind, "observed cell means (incomplete design)"),
        all_effects=effects.all_effects,
        shapley_check=_shapley_check(shapley, values),
        aliases=_alias_lines(info, factors),
        notes=notes + _design_notes(info, factors, values, paths),
        percent=bool(results[metric].between(0, 1).all()),
        paper_reference=PAPER_AIME_AVG32 if any(name == "paper" for name, _ in paths) else None,
    )
