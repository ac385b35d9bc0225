"""One analysis of a results table: every report table, with intervals, as pandas DataFrames.

Steps: validate the table -> read the design from its cells -> fit the cell-means model with
seeds as blocks (``inference``) -> express all 2^k cell means as a linear map of the observed
ones (observed cells in place; a resolution V+ fraction's other cells from the fitted model;
NaN where the design lacks them) -> every statistic (a cell, a step of an ordering, a gain by
position, a Shapley or Banzhaf value, leave-one-out, add-one, an order gap, an effect) is a
row of a contrast matrix over those means, estimated with its exact SE, df and method ->
the claims families, adjusted for multiplicity (``claims``).

Cost: at most MAX_FACTORS (12) factors, checked with the table. The statistics over all 2^k
cells are built as contrast rows directly (``shapley.*_matrix``: O(k 2^k) each), the observed
cells are read off by index, and the inference uses the structure of the design (``inference``:
a diagonal G^-1; ``design``: the Walsh transform for the alias structure), so a 2^12 factorial
analyses in seconds (benchmarks/report_factors.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import factorial
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd
from scipy import stats

from dapo_ablate.core.contracts import SEED_COLUMN, FactorInfo

from . import shapley as sv
from .claims import ClaimOptions, Guarantee, StatisticsToTest, build_tests, claims_table, simultaneous_effects
from .compute import budget_values, compute_table
from .design import DesignInfo, describe_design, require_design, two_factor_chains
from .effects import EFFECT_COLUMNS, EffectContrasts, effect_contrasts, lenth_pse, model_prediction_map
from .inference import (
    LENTH, NONE, WELCH, CellFit, Estimates, Noise, estimate, estimate_over_new_seeds, fit_cells, quadratic_forms,
)  # fmt: skip
from .method_text import ci_method, design_notes, effects_method, seed_notes, values_source
from .multiplicity import lenth_bar, lenth_margins
from .options import ReportOptions, report_options
from .orderings import cumulative_means, path_masks, position_summary, resolve_orderings
from .table import PAPER_AIME_AVG32, cell_label, cell_masks, validate_results

if TYPE_CHECKING:
    from .decision import Decision

Statistic = Callable[[np.ndarray], np.ndarray]  # [..., 2**k] -> [..., out], linear
INTERVAL_COLUMNS = ["table", "row", "column", "estimate", "se", "df", "ci_low", "ci_high", "se_method"]


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
    effects: pd.DataFrame  # EFFECT_COLUMNS: main effects and two-factor interactions (or chains)
    leave_one_out: pd.DataFrame
    compute: pd.DataFrame
    compute_matched: pd.DataFrame  # effects at equal steps beside effects at an equal token budget
    order_gaps: pd.DataFrame  # factor, first, last, gap (last - first), ci_low, ci_high, p_value
    claims: pd.DataFrame  # claims.CLAIM_COLUMNS: the summary's "supported by the data" list
    tests: pd.DataFrame  # every tested statistic of every family, claimed or not
    intervals: pd.DataFrame  # INTERVAL_COLUMNS: every interval in the report, with SE, df, method
    ci_method: str
    effects_method: str
    values_source: str  # where the 2^k cell means behind Shapley and orderings come from
    fit: CellFit = field(repr=False)
    all_effects: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)
    shapley_check: dict | None = None  # {"sum", "full", "baseline", "ok"}
    aliases: list[str] = field(default_factory=list)  # every two-factor alias chain, in full
    notes: list[str] = field(default_factory=list)
    described: list[str] = field(default_factory=list)  # descriptive lines (no test behind them)
    percent: bool = True  # metric in [0, 1]: display as percentage points
    paper_reference: tuple[int, ...] | None = None  # shown beside the `paper` ordering
    options: ClaimOptions = field(default_factory=ClaimOptions)
    lenth: dict | None = None  # {"pse", "me", "sme", "m", "d", "bar", "bar_last", "over"}, one run per cell (lenth_rule)
    guarantee: Guarantee | None = None  # the error statement of the claims list
    values: CellValues | None = field(default=None, repr=False)  # the 2^k cell means behind every statistic
    levels: tuple[FactorInfo, ...] = ()  # what each factor's 0 and 1 stand for, when the spec is known
    compute_curves: pd.DataFrame = field(default_factory=pd.DataFrame)  # compute_curves.CURVE_EFFECT_COLUMNS
    table_notes: dict[str, str] = field(default_factory=dict)  # table name -> the line under it (how made, or why empty)
    looks: pd.DataFrame = field(default_factory=pd.DataFrame)  # looks.LOOK_TABLE_COLUMNS (adaptive designs)
    look_lines: list[str] = field(default_factory=list)  # one line per look, then the last look's terms (adaptive)
    decision: Decision | None = None  # what the data support by the design's rule (decision.decision_of)
    held_on: tuple[str, ...] = ()  # techniques on in every run without being factors (ReportOptions.held_on)
    provenance: tuple[str, ...] = ()  # what produced the results (ReportOptions.provenance)
    evidence: dict[str, list[str]] = field(default_factory=dict)  # the report's evidence sections (evidence.Evidence)


class CellValues:
    """All 2^k cell means as a linear map of the observed ones, and every statistic's inference.

    The map is the fitted model's prediction map [2^k, m] for a resolution V+ fraction; otherwise
    each observed cell is its own mean and the others are missing, kept as indices (``map`` None)
    instead of a [2^k, m] matrix, so a statistic's contrast rows are read off, not multiplied."""

    def __init__(self, fit: CellFit, design: DesignInfo, noise: Noise, confidence: float):
        self.fit, self.noise, self.confidence, self.k = fit, noise, confidence, design.k
        self.map: np.ndarray | None = None
        self.missing = np.ones(2**design.k, dtype=bool)
        self.point = np.full(2**design.k, np.nan)
        if design.kind == "fraction" and (design.resolution or 0) >= 5:
            self.map = model_prediction_map(design, fit.information())  # [2**k, m]
            self.missing[:] = False
            self.point = self.map @ fit.mu
        else:  # observed cells in place (cell fit.masks[j] is mean j), others missing
            self.missing[fit.masks] = False
            self.point[fit.masks] = fit.mu
        self.records: list[pd.DataFrame] = []
        self._identity: np.ndarray | None = None

    def contrasts(self, statistic: Statistic | np.ndarray) -> np.ndarray:
        """[out, m] contrast rows over the observed cells of a linear statistic of the 2^k cell
        means, given as a function or as its matrix [out, 2**k] (e.g. ``shapley.shapley_matrix``,
        which avoids applying the function to the identity); NaN rows need a missing cell."""
        if callable(statistic):
            if self._identity is None:  # [2**k, 2**k], kept for the next statistic
                self._identity = np.eye(2**self.k)
            over_all = np.asarray(statistic(self._identity), dtype=float).T  # [out, 2**k]
        else:
            over_all = np.atleast_2d(np.asarray(statistic, dtype=float))
        needs_missing = (np.nan_to_num(over_all[:, self.missing], nan=1.0) != 0).any(axis=1)
        needs_missing |= np.isnan(over_all).any(axis=1)
        if self.map is None:
            rows = np.nan_to_num(over_all[:, self.fit.masks])
        else:
            rows = np.nan_to_num(over_all) @ self.map
        rows[needs_missing] = np.nan
        return rows

    def summarize(self, statistic: Statistic | np.ndarray, table: str, rows: list[str], column: str) -> Estimates:
        """Estimates of a linear statistic, logged for intervals.csv under (table, row, column)."""
        return self.summarize_rows(self.contrasts(statistic), table, rows, column)

    def summarize_rows(self, contrasts: np.ndarray, table: str, rows: list[str], column: str) -> Estimates:
        result = estimate(self.fit, contrasts, self.noise, self.confidence)
        self.records.append(
            pd.DataFrame(
                {
                    "table": table, "row": rows, "column": column, "estimate": result.estimate,
                    "se": result.se, "df": result.df, "ci_low": result.ci_low, "ci_high": result.ci_high,
                    "se_method": result.method,
                }  # fmt: skip
            )
        )
        return result


def _cells_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    """Per observed cell: runs, estimated mean (seed-adjusted when blocked), sd over runs, CI for
    these seeds, and CI over new seeds (seed effects counted as random)."""
    fit = values.fit
    labels = [cell_label(int(m), factors) for m in fit.masks]
    est = values.summarize_rows(np.eye(len(fit.masks)), "cells", labels, "mean")
    new_seeds = estimate_over_new_seeds(fit, np.eye(len(fit.masks)), values.noise, values.confidence, est)
    return pd.DataFrame(
        {
            "cell": labels,
            **{f: (fit.masks >> i) & 1 for i, f in enumerate(factors)},
            "n": fit.n.astype(int),
            "mean": est.estimate,
            "sd": fit.sd,
            "ci_low": est.ci_low,
            "ci_high": est.ci_high,
            "seed_ci_low": new_seeds.ci_low,
            "seed_ci_high": new_seeds.ci_high,
            "rank": pd.Series(est.estimate).rank(ascending=False, method="min").to_numpy(),  # 1: the highest mean
        }
    )


def _cumulative_table(values: CellValues, paths: list[tuple[str, list[str]]], factors: list[str]) -> pd.DataFrame:
    """One row per (ordering, step); ``observed`` False where the step's cell was not run (a
    fraction's mean is then the fitted model's prediction)."""
    rows = []
    run = set(int(mask) for mask in values.fit.masks)
    for name, path in paths:
        masks = path_masks(path, factors)
        labels = [f"{name} step {s}" for s in range(len(masks))]
        mean = values.summarize(lambda v: cumulative_means(v, masks)[0], "cumulative", labels, "mean")
        delta = values.summarize(lambda v: cumulative_means(v, masks)[1], "cumulative", labels, "delta")
        for step in range(len(masks)):
            rows.append(
                {
                    "ordering": name,
                    "step": step,
                    "added": path[step - 1] if step else "baseline",
                    "mean": mean.estimate[step],
                    "ci_low": mean.ci_low[step],
                    "ci_high": mean.ci_high[step],
                    "delta": delta.estimate[step],
                    "delta_ci_low": delta.ci_low[step],
                    "delta_ci_high": delta.ci_high[step],
                    "observed": int(masks[step]) in run,
                }
            )
    return pd.DataFrame(rows)


ORDERING_COLUMNS = ["factor", "position", "n_orderings", "mean", "ci_low", "ci_high", "min", "max", "share_positive"]


def _orderings_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    k, rows = len(factors), []
    if np.isnan(values.point).any():
        return pd.DataFrame(columns=ORDERING_COLUMNS)
    for i, factor in enumerate(factors):
        summary = position_summary(values.point, i)
        positions = [str(p + 1) for p in range(k)] + ["all"]
        est = values.summarize(
            sv.position_matrix(k, i), "orderings", [f"{factor} position {p}" for p in positions], "mean"
        )
        for p in range(k + 1):
            rows.append(
                {
                    "factor": factor,
                    "position": positions[p],
                    "n_orderings": factorial(k - 1) if p < k else factorial(k),
                    "mean": est.estimate[p],
                    "ci_low": est.ci_low[p],
                    "ci_high": est.ci_high[p],
                    "min": summary["min"][p],
                    "max": summary["max"][p],
                    "share_positive": summary["share_positive"][p],
                }
            )
    return pd.DataFrame(rows, columns=ORDERING_COLUMNS)


def _order_gap_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    """Per factor: gain when added last minus when added first, with CI and p-value.

    Non-zero exactly when the factor interacts with others: gain_last - gain_first =
    [v(all) - v(all - i)] - [v(i) - v(none)].
    """
    if len(factors) < 2:
        return pd.DataFrame()
    gap = values.summarize(lambda v: sv.leave_one_out(v) - sv.add_one(v), "order_gaps", factors, "gap")
    first = values.contrasts(sv.add_one) @ values.fit.mu
    return pd.DataFrame(
        {
            "factor": factors,
            "first": first,
            "last": first + gap.estimate,
            "gap": gap.estimate,
            "ci_low": gap.ci_low,
            "ci_high": gap.ci_high,
            "p_value": gap.p_value,
        }
    )


def _shapley_table(values: CellValues, factors: list[str]) -> tuple[pd.DataFrame, Estimates]:
    phi = values.summarize(sv.shapley_matrix(len(factors)), "shapley", factors, "shapley")
    beta = values.summarize(sv.banzhaf_matrix(len(factors)), "shapley", factors, "banzhaf")
    table = pd.DataFrame(
        {
            "factor": factors,
            "shapley": phi.estimate,
            "ci_low": phi.ci_low,
            "ci_high": phi.ci_high,
            "banzhaf": beta.estimate,
            "banzhaf_ci_low": beta.ci_low,
            "banzhaf_ci_high": beta.ci_high,
        }
    )
    return table, phi


def _leave_one_out_table(values: CellValues, factors: list[str]) -> pd.DataFrame:
    loo = values.summarize(sv.leave_one_out, "leave_one_out", factors, "leave_one_out")
    add = values.summarize(sv.add_one, "leave_one_out", factors, "add_one")
    return pd.DataFrame(
        {
            "factor": factors,
            "leave_one_out": loo.estimate,
            "loo_ci_low": loo.ci_low,
            "loo_ci_high": loo.ci_high,
            "add_one": add.estimate,
            "add_one_ci_low": add.ci_low,
            "add_one_ci_high": add.ci_high,
        }
    )


def _effects_table(values: CellValues, contrasts: EffectContrasts) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(main effects and two-factor terms, every effect) with SE, df, p-value and ``order``."""
    est = values.summarize_rows(contrasts.contrasts, "effects", contrasts.names, "effect")
    table = pd.DataFrame(
        {
            "term": contrasts.names,
            "effect": est.estimate,
            "se": est.se,
            "ci_low": est.ci_low,
            "ci_high": est.ci_high,
            "p_value": est.p_value,
            "df": est.df,
            "p_adjusted": np.nan,
            "order": contrasts.orders,
        }
    )
    return table[table["order"] <= 2].reset_index(drop=True), table


def _shapley_check(shapley: pd.DataFrame, values: CellValues) -> dict | None:
    """Efficiency: sum of Shapley values == v(all) - v(none), up to rounding."""
    if shapley["shapley"].isna().any():
        return None
    full, baseline = float(values.point[-1]), float(values.point[0])
    total = float(shapley["shapley"].sum())
    return {"sum": total, "full": full, "baseline": baseline, "ok": bool(np.isclose(total, full - baseline, atol=1e-9))}


def noise_model(fit: CellFit, design: DesignInfo, effects: EffectContrasts, confidence: float) -> tuple[Noise, dict | None]:
    """The cells' own residual variances when the fit has residual df (``inference``); with none,
    Lenth's PSE for full and regular fractional designs (sigma^2 = PSE^2 / c'G^-1c of an effect,
    d = m / 3 df); else none."""
    if fit.df > 0:
        return Noise(fit.sigma2, fit.df, WELCH), None
    if design.kind in ("full", "fraction") and len(effects.names) >= 3:
        point = effects.contrasts @ fit.mu
        pse = lenth_pse(point)
        unit = float(np.mean(quadratic_forms(fit, effects.contrasts)))
        me, sme, d = lenth_margins(pse, len(point), 1 - confidence)
        if pse > 0:
            return Noise(pse**2 / unit, d, LENTH), {"pse": pse, "me": me, "sme": sme, "m": len(point), "d": d}
    return Noise(float("nan"), 0.0, NONE), None


def fit_table(results: pd.DataFrame, factors: list[str], metric: str) -> CellFit:
    """The cell-means model of a validated results table, seeds as blocks (``inference.fit_cells``)."""
    masks, cell_index = np.unique(cell_masks(results, factors), return_inverse=True)
    _, seed_index = np.unique(results[SEED_COLUMN].astype(str).to_numpy(), return_inverse=True)
    return fit_cells(cell_index.ravel(), seed_index.ravel(), results[metric].to_numpy(float), masks.astype(np.int64))


@dataclass(frozen=True)
class _Model:
    """The fitted cell-means model of one analysis and what every table is computed from."""

    factors: list[str]
    options: ReportOptions
    fit: CellFit
    design: DesignInfo
    contrasts: EffectContrasts  # the design's estimable effects
    noise: Noise
    lenth: dict | None  # Lenth's PSE and margins when the noise comes from it
    values: CellValues
    paths: list[tuple[str, list[str]]]  # the orderings of the cumulative tables, by name


def _fit_model(results: pd.DataFrame, factors: list[str], options: ReportOptions) -> tuple[_Model, list[str]]:
    """(the model of a validated table, the orderings' notes); ReportInputError for a design the
    options refuse or an ordering that does not name the factors."""
    fit = fit_table(results, factors, options.metric)
    design = describe_design(fit.masks, len(factors))
    require_design(design, options.design, factors)
    paths, notes = resolve_orderings(options.orderings, factors)
    contrasts = effect_contrasts(design, factors, fit.information())
    noise, lenth = noise_model(fit, design, contrasts, options.confidence)
    values = CellValues(fit, design, noise, options.confidence)
    return _Model(factors, options, fit, design, contrasts, noise, lenth, values, paths), notes


def analyze(
    results: pd.DataFrame,
    factors: list[str],
    *,
    options: ReportOptions | None = None,
    curves: pd.DataFrame | None = None,
    **changes,
) -> Analysis:
    """Every report table for ``results`` (see the module docstring for the steps). ``options``:
    its metric, orderings, confidence, design, adjust and per_effect_tests are used (``changes``:
    any field by keyword, ``analyze(results, factors, adjust="bh")``); ``curves``: evaluation
    curves with cumulative ``tokens_generated``, for the equal-compute view."""
    options = report_options(options, changes)
    factors, metric = list(factors), options.metric
    results = validate_results(results, factors, metric)
    model, notes = _fit_model(results, factors, options)
    fit, info, values, claims = model.fit, model.design, model.values, options.claims
    effects, all_effects = _effects_table(values, model.contrasts)
    shapley, phi = _shapley_table(values, factors)
    order_gaps = _order_gap_table(values, factors)
    cumulative = _cumulative_table(values, model.paths, factors)  # before the tests: intervals.csv's row order
    statistics = StatisticsToTest(shapley, phi, effects, order_gaps)
    tests, effects, guarantee = build_tests(info, factors, values, model.paths, statistics, claims, model.lenth)
    effects = effects[EFFECT_COLUMNS]
    percent = bool(results[metric].between(0, 1).all())
    compute, matched, compute_notes = _compute_views(results, model, effects, curves)
    return Analysis(
        factors=factors,
        metric=metric,
        confidence=options.confidence,
        design=info,
        n_runs=len(results),
        cells=_cells_table(values, factors),
        cumulative=cumulative,
        orderings=_orderings_table(values, factors),
        shapley=shapley,
        effects=effects,
        leave_one_out=_leave_one_out_table(values, factors),
        compute=compute,
        compute_matched=matched,
        order_gaps=order_gaps,
        claims=claims_table(tests),
        tests=tests,
        intervals=(intervals := _intervals_table(values.records)),
        ci_method=ci_method(fit, model.noise, model.lenth, intervals),
        effects_method=effects_method(info, model.contrasts, model.noise),
        values_source=values_source(info),
        fit=fit,
        all_effects=all_effects,
        shapley_check=_shapley_check(shapley, values),
        aliases=two_factor_chains(info, factors) if info.kind == "fraction" else [],
        notes=notes + design_notes(info, factors, values.point, model.paths, model.contrasts) + seed_notes(fit, percent) + compute_notes,
        percent=percent,
        paper_reference=PAPER_AIME_AVG32 if any(name == "paper" for name, _ in model.paths) else None,
        options=claims,
        lenth=lenth_rule(model.lenth, claims, guarantee, simultaneous_effects(model.lenth, claims), _tested_effects(tests)),
        guarantee=guarantee,
        values=values,
        held_on=tuple(options.held_on), provenance=tuple(options.provenance),
    )


def _tested_effects(tests: pd.DataFrame) -> int:
    """Tests in the family of two-factor effects (where one seed's effects are tested)."""
    return int((tests["family"] == "interactions").sum())


def lenth_rule(
    lenth: dict | None, options: ClaimOptions, guarantee: Guarantee, sidak_m: int | None, tested: int
) -> dict | None:
    """``lenth`` with ``bar``: the |effect| an effect must pass to be claimed, as applied. Lenth's
    simultaneous rule at the family's share alpha / F over ``sidak_m`` effects (all effects of the
    settings it pools); with --per-effect-tests the family's own adjustment applies instead, and
    the bar is that of its first (strictest) step over the family's tests (``bar_last``: the last)."""
    if lenth is None:
        return None
    n_families = 1 if options.adjust == "none" else guarantee.n_families
    if sidak_m is not None:
        bar = lenth_bar(lenth["pse"], lenth["d"], sidak_m, options.alpha, n_families)
        return lenth | {"bar": bar, "bar_last": None, "over": sidak_m}
    tested = max(tested, 1) if options.adjust != "none" else 1
    first = float(stats.t.ppf(1 - options.alpha / (2 * n_families * tested), lenth["d"]) * lenth["pse"])
    last = float(stats.t.ppf(1 - options.alpha / (2 * n_families), lenth["d"]) * lenth["pse"])
    return lenth | {"bar": first, "bar_last": last, "over": None}


def _intervals_table(records: list[pd.DataFrame]) -> pd.DataFrame:
    """Every computed statistic with its SE, df, interval and method (rows that need a missing
    cell, or a step 0's delta, are left out)."""
    table = pd.concat(records, ignore_index=True)[INTERVAL_COLUMNS]
    return table[table["estimate"].notna()].reset_index(drop=True)


def _compute_views(results: pd.DataFrame, model: _Model, effects: pd.DataFrame, curves: pd.DataFrame | None):
    """(compute table, equal-compute effects table, notes)."""
    factors, fit, metric, confidence = model.factors, model.fit, model.options.metric, model.options.confidence
    compute = compute_table(results, factors, metric, pd.Series(fit.mu, index=fit.masks))
    matched = pd.DataFrame(columns=COMPUTE_MATCHED_COLUMNS)
    notes: list[str] = []
    at_budget = budget_values(curves, results, factors, metric) if curves is not None else None
    if at_budget is not None and len(at_budget[0]):
        budget_results, budget, not_reached = at_budget
        budget_fit = fit_table(budget_results, factors, metric)
        compute["mean_at_budget"] = pd.Series(budget_fit.mu, index=budget_fit.masks).reindex(compute.index)
        compute["runs_at_budget"] = pd.Series(budget_fit.n, index=budget_fit.masks).reindex(compute.index).fillna(0)
        same_cells = np.array_equal(budget_fit.masks, fit.masks)
        budget_design = model.design if same_cells else describe_design(budget_fit.masks, len(factors))
        matched = _matched_effects(budget_fit, budget_design, factors, effects, confidence, budget)
        notes.append(
            f"Equal compute: each run's {metric} at {budget / 1e6:.3g}M generated tokens (the smallest total any "
            "run reached), interpolated linearly between its evaluations; compute_matched.csv sets the effects "
            "there beside the effects at equal steps."
            + (
                f" {not_reached} run{'s' if not_reached > 1 else ''} had generated more than that by {'their' if not_reached > 1 else 'its'} "
                "first evaluation: not reached, left out of that view (not given the first evaluation's value)."
                if not_reached
                else ""
            )
        )
    elif curves is not None:
        notes.append("The evaluation curves lack cumulative token counts for some runs, so no equal-compute view.")
    return compute.reset_index(drop=True), matched, notes


COMPUTE_MATCHED_COLUMNS = [
    "term", "effect", "ci_low", "ci_high", "effect_at_budget", "budget_ci_low", "budget_ci_high", "budget_tokens",
]  # fmt: skip


def _matched_effects(budget_fit, design, factors, effects, confidence, budget) -> pd.DataFrame:
    contrasts = effect_contrasts(design, factors, budget_fit.information())
    noise, _ = noise_model(budget_fit, design, contrasts, confidence)
    est = estimate(budget_fit, contrasts.contrasts, noise, confidence)
    at_budget = pd.DataFrame(
        {"term": contrasts.names, "effect_at_budget": est.estimate, "budget_ci_low": est.ci_low,
         "budget_ci_high": est.ci_high}
    )  # fmt: skip
    table = effects[["term", "effect", "ci_low", "ci_high"]].merge(at_budget, on="term", how="left")
    table["budget_tokens"] = budget
    return table[COMPUTE_MATCHED_COLUMNS]
