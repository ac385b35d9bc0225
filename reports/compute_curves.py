"""Compute curves: does a technique raise the ceiling a run approaches, or only how fast it gets there?

Every run's evaluation metric against the compute spent so far (cumulative generated tokens, or
GPU-hours where recorded) is fitted with the saturating form ScaleRL uses (Khatri et al. 2025):

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

A is the asymptote (the ceiling), C_mid the compute at which half of the gain A - R0 is reached,
B the steepness; R(0) = R0. For fixed (C_mid, B) the form is linear in (R0, A), so each run is
fitted by variable projection: a grid over (log C_mid, B) with (R0, A) solved by least squares at
each point, then refined by ``scipy.optimize.least_squares``. B is shared by all runs of the
experiment (the B minimising the summed squared error over the grid): with the few evaluations a
run has, B and C_mid trade off against each other, and a common B makes the midpoints comparable
(the compute to reach half the gain, under one shape). A run needs at least 4 evaluations at 3
distinct compute values, else it is not fitted (and said so).

**Effects with intervals** (two-stage, the summary-statistics approach): the per-run estimates
A_r, log C_mid_r and the final metric are three responses of the factorial, analysed by the
report's own engine (``analysis.fit_table``, ``effects.effect_contrasts``,
``inference.estimate``: seeds as blocks, each cell's own variance, Welch-Satterthwaite df). The
spread of a cell's per-run estimates over its seeds includes the fit's own error, so no delta
method is needed, and the intervals hold when each run's fit is close to unbiased (checked by
benchmarks/compute_curves_sim.py: coverage of planted effects). Effects on log C_mid are
differences of logs: exp(effect) is the ratio of the compute to half the gain (below 1: faster).

**Verdict per technique**: its main effects on A and on log C_mid are tested together (Holm over
the 2 x k tests at ``alpha``): moves the ceiling (A only), only the speed (C_mid only), both,
neither (neither interval excludes 0: no evidence of a change, not proof of none), or not
enough data: no interval (too few fitted runs or seeds), an interval that says nothing (on A
wider than MAX_ASYMPTOTE_CI, on the midpoint ratio spanning more than MAX_MIDPOINT_RATIO_SPAN),
or curves that have not bent within the compute observed (MAX_EDGE_SHARE), where A and C_mid
trade off. The final metric's effect is the report's own main effect (effects.csv), the same
interval on every page.

Input: an evaluation-curve table, one row per (run, evaluation): the factor columns (0/1),
``seed``, ``step``, the metric, the cumulative compute column (``tokens_generated``, as
``store.results.curves_frame`` writes it; or ``gpu_hours``) and optionally ``run_id`` (runs are
told apart by it, else by cell and seed).

    from dapo_ablate.reports.compute_curves import analyze_curves
    curves = analyze_curves(curves_table, factors, metric="avg@32")   # CurveAnalysis
    curves.effects     # CURVE_EFFECT_COLUMNS per technique
    curves.cells       # per cell: the curve fitted to its seeds' points (the figure's lines)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize

from dapo_ablate.core.contracts import DEFAULT_METRIC, SEED_COLUMN

from .analysis import fit_table, noise_model
from .design import describe_design
from .effects import effect_contrasts
from .inference import estimate
from .multiplicity import holm
from .table import ReportInputError, cell_label, cell_masks, validate_curves, validate_results

COMPUTE_COLUMNS_CURVES = ("tokens_generated", "gpu_hours")
"""The compute axes a curve table may carry (cumulative per run)."""
MIN_POINTS = 4
"""Evaluations a run needs (at 3 or more distinct compute values) for a fit with residual df."""
LOG_B_GRID = np.linspace(np.log(0.3), np.log(6.0), 24)
CURVE_EFFECT_COLUMNS = [
    "term", "asymptote_effect", "asymptote_ci_low", "asymptote_ci_high", "asymptote_p_adjusted",
    "midpoint_log_effect", "midpoint_ci_low", "midpoint_ci_high", "midpoint_p_adjusted", "midpoint_ratio",
    "final_effect", "final_ci_low", "final_ci_high", "verdict",
]  # fmt: skip
CEILING, SPEED, BOTH, NEITHER, NOT_ENOUGH = "moves the ceiling", "only the speed", "both", "neither", "not enough data"
MAX_ASYMPTOTE_CI = 0.5
"""An interval on the asymptote wider than this (half the range of an accuracy) says nothing: its
verdict is "not enough data", not "neither"."""
MAX_MIDPOINT_RATIO_SPAN = 100.0
"""An interval on the midpoint ratio spanning more than this factor (e.g. 0.1x to 10x) says nothing."""
MAX_EDGE_SHARE = 0.5
"""When more than this share of the fitted runs reach half their gain beyond their data (their
midpoint past their last evaluation, or at the grid's edge), the curves
have not bent within the compute observed: the asymptote and the midpoint trade off, and every
verdict is "not enough data" (simulated: a speed-only technique then shows a spurious ceiling effect)."""


def saturating_curve(compute, r0, asymptote, midpoint, steepness) -> np.ndarray:
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0.

    Example: R0 = .2, A = .6, C_mid = 1e6, B = 2: at C = 1e6 half the gain, .4; at C = 2e6,
    .2 + .4 / (1 + 1/4) = .52; at C = 0, .2."""
    compute = np.asarray(compute, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        share = 1.0 / (1.0 + np.exp(steepness * (np.log(midpoint) - np.log(compute))))
    return r0 + (asymptote - r0) * np.where(compute > 0, share, 0.0)


@dataclass(frozen=True)
class _Runs:
    """Every run's points, padded to [runs, points] (NaN beyond a run's last evaluation)."""

    keys: pd.DataFrame  # one row per run: factors, seed (and run_id)
    compute: np.ndarray
    metric: np.ndarray

    @property
    def valid(self) -> np.ndarray:
        return ~np.isnan(self.metric)


def _log_compute(runs: _Runs) -> np.ndarray:
    """log C per point, -inf at C = 0 (where the share g is 0)."""
    positive = runs.compute > 0
    return np.where(positive, np.log(np.where(positive, runs.compute, 1.0)), -np.inf)


def _shares(log_compute: np.ndarray, log_mid: np.ndarray, steepness: float) -> np.ndarray:
    """g = 1 / (1 + (C_mid / C)^B), 0 at C = 0: [runs, grid, points] from log_compute [runs,
    points] and log_mid [grid] (shared) or [runs, grid] (per run)."""
    log_mid = np.atleast_2d(log_mid)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(steepness * (log_mid[:, :, None] - log_compute[:, None, :])))


def _project(shares: np.ndarray, y: np.ndarray, valid: np.ndarray):
    """Least squares of y = R0 (1 - g) + A g for every grid point: (R0, A, SSE), each [runs, grid]."""
    w = valid[:, None, :].astype(float)
    u, g, yy = (1 - shares) * w, shares * w, np.nan_to_num(y)[:, None, :] * w
    suu, sgg, sug = (u * u).sum(-1), (g * g).sum(-1), (u * g).sum(-1)
    suy, sgy = (u * yy).sum(-1), (g * yy).sum(-1)
    det = suu * sgg - sug**2
    with np.errstate(invalid="ignore", divide="ignore"):
        r0 = np.where(det > 1e-12, (sgg * suy - sug * sgy) / det, np.nan)
        a = np.where(det > 1e-12, (suu * sgy - sug * suy) / det, np.nan)
    sse = (((yy - r0[..., None] * u - a[..., None] * g) * w) ** 2).sum(-1)
    return r0, a, np.where(np.isnan(r0), np.inf, sse)


def _mid_grid(runs: _Runs) -> np.ndarray:
    """log C_mid candidates: from 3 e-folds below the smallest positive compute to 2 above the largest."""
    positive = runs.compute[(runs.compute > 0) & runs.valid]
    return np.linspace(np.log(positive.min()) - 3, np.log(positive.max()) + 2, 60)


def _shared_steepness(runs: _Runs, log_b_grid: np.ndarray) -> float:
    """The B minimising the summed SSE of all runs (each at its best grid C_mid): the grid, then a
    bounded scalar search between the best point's neighbours (to 1e-3 in log B)."""
    log_compute, mids = _log_compute(runs), _mid_grid(runs)

    def total(log_b: float) -> float:
        _, _, sse = _project(_shares(log_compute, mids, np.exp(log_b)), runs.metric, runs.valid)
        return float(np.sum(sse.min(axis=1)))

    totals = [total(log_b) for log_b in log_b_grid]
    best = int(np.argmin(totals))
    if len(log_b_grid) == 1:
        return float(np.exp(log_b_grid[0]))
    low, high = log_b_grid[max(best - 1, 0)], log_b_grid[min(best + 1, len(log_b_grid) - 1)]
    found = optimize.minimize_scalar(total, bounds=(low, high), method="bounded", options={"xatol": 1e-3})
    return float(np.exp(found.x))


GOLDEN = (np.sqrt(5) - 1) / 2


def _fit(runs: _Runs, steepness: float) -> tuple[np.ndarray, np.ndarray]:
    """([runs, 3] = R0, A, log C_mid at ``steepness``, at the grid's edge): each run's best grid
    C_mid, then a golden-section search on its profile SSE between the neighbouring grid points,
    all runs at once (40 steps: the bracket shrinks to 1e-8 of a grid step)."""
    log_compute, mids, rows = _log_compute(runs), _mid_grid(runs), np.arange(len(runs.metric))
    _, _, sse = _project(_shares(log_compute, mids, steepness), runs.metric, runs.valid)
    pick = np.argmin(sse, axis=1)
    low, high = mids[np.maximum(pick - 1, 0)], mids[np.minimum(pick + 1, len(mids) - 1)]

    def profile(log_mid: np.ndarray) -> np.ndarray:
        return _project(_shares(log_compute, log_mid[:, None], steepness), runs.metric, runs.valid)[2][:, 0]

    for _ in range(40):
        left, right = high - GOLDEN * (high - low), low + GOLDEN * (high - low)
        better_left = profile(left) <= profile(right)
        high, low = np.where(better_left, right, high), np.where(better_left, low, left)
    log_mid = (low + high) / 2
    r0, a, _ = _project(_shares(log_compute, log_mid[:, None], steepness), runs.metric, runs.valid)
    edge = (pick == 0) | (pick == len(mids) - 1)
    return np.column_stack([r0[rows, 0], a[rows, 0], log_mid]), edge


def _run_keys(curves: pd.DataFrame, factors: list[str]) -> list[str]:
    if "run_id" in curves.columns and curves["run_id"].notna().all():
        return [*factors, SEED_COLUMN, "run_id"]
    return [*factors, SEED_COLUMN]


def _checked(curves: pd.DataFrame, factors: list[str], metric: str, compute: str) -> pd.DataFrame:
    """The validated curves with numeric compute and metric; ReportInputError, one sentence each."""
    curves = validate_curves(curves, factors, metric)
    if compute not in curves.columns:
        raise ReportInputError(
            f"curves table lacks column '{compute}'; give each evaluation's cumulative {compute} "
            f"(or choose another compute axis: {', '.join(COMPUTE_COLUMNS_CURVES)})"
        )
    values = pd.to_numeric(curves[compute], errors="coerce")
    metric_values = pd.to_numeric(curves[metric], errors="coerce")
    if ((values < 0) | ~np.isfinite(values.fillna(0))).any():
        raise ReportInputError(
            f"column '{compute}' of the curves table has negative or infinite values; give cumulative compute (>= 0)"
        )
    if (~np.isfinite(metric_values.fillna(0))).any():
        raise ReportInputError(f"column '{metric}' of the curves table has infinite values; give finite metric values")
    table = curves.assign(**{compute: values, metric: metric_values}).dropna(subset=[compute, metric])
    if table.empty:
        raise ReportInputError(
            f"the curves table has no evaluation with both {metric} and {compute}; log them per evaluation"
        )
    return table


def _gather(curves: pd.DataFrame, factors: list[str], metric: str, compute: str, keys: list[str] | None = None):
    """The curves as [runs, points] arrays sorted by compute (NaN-padded); runs told apart by
    ``keys`` (default: run_id, else cell and seed)."""
    table = _checked(curves, factors, metric, compute)
    keys = keys or _run_keys(table, factors)
    table = table.sort_values([*keys, compute], kind="stable")
    run = table.groupby(keys, sort=False).ngroup().to_numpy()
    position = table.groupby(keys, sort=False).cumcount().to_numpy()
    x, y = np.zeros((run.max() + 1, position.max() + 1)), np.full((run.max() + 1, position.max() + 1), np.nan)
    x[run, position], y[run, position] = table[compute].to_numpy(float), table[metric].to_numpy(float)
    return _Runs(table.drop_duplicates(keys)[keys].reset_index(drop=True), x, y)


def _eligible(runs: _Runs) -> np.ndarray:
    distinct = np.array([len(np.unique(c[v])) for c, v in zip(runs.compute, runs.valid)])
    return (runs.valid.sum(axis=1) >= MIN_POINTS) & (distinct >= 3)


def _fitted(runs: _Runs, steepness: float | None) -> tuple[np.ndarray, np.ndarray, float]:
    """(params [runs, 3], at_edge, B) over the eligible runs (NaN elsewhere); B shared, estimated
    from them when None."""
    ok = _eligible(runs)
    params, edge = np.full((len(ok), 3), np.nan), np.zeros(len(ok), dtype=bool)
    if ok.any():
        chosen = _Runs(runs.keys[ok], runs.compute[ok], runs.metric[ok])
        steepness = _shared_steepness(chosen, LOG_B_GRID) if steepness is None else steepness
        params[ok], edge[ok] = _fit(chosen, steepness)
    return params, edge, float("nan") if steepness is None else float(steepness)


def _run_table(runs: _Runs, params: np.ndarray, edge: np.ndarray) -> pd.DataFrame:
    last = runs.valid.sum(axis=1) - 1
    rows = np.arange(len(last))
    return runs.keys.assign(
        r0=params[:, 0], asymptote=params[:, 1], midpoint=np.exp(params[:, 2]), log_midpoint=params[:, 2],
        final=runs.metric[rows, last], final_compute=runs.compute[rows, last], points=runs.valid.sum(axis=1),
        fitted=np.isfinite(params[:, 1]), at_edge=edge,
    )  # fmt: skip


def fit_runs(
    curves: pd.DataFrame, factors: list[str], metric: str = DEFAULT_METRIC, compute: str = "tokens_generated"
) -> tuple[pd.DataFrame, float]:
    """(one row per run: its keys, r0, asymptote, midpoint, log_midpoint, final, final_compute,
    points, fitted, at_edge; the shared steepness B). ``at_edge``: the midpoint sits at the grid's
    end (beyond the data: the asymptote is an extrapolation). Runs with too few evaluations are
    kept with fitted False and NaN parameters."""
    runs = _gather(curves, list(factors), metric, compute)
    params, edge, steepness = _fitted(runs, None)
    return _run_table(runs, params, edge), steepness


def fit_cell_curves(
    curves: pd.DataFrame, factors: list[str], steepness: float, metric: str = DEFAULT_METRIC,
    compute: str = "tokens_generated",
) -> pd.DataFrame:  # fmt: skip
    """Per cell: the curve fitted to the pooled points of its seeds at ``steepness``: cell, factor
    columns, runs, r0, asymptote, midpoint, steepness (the figure's lines)."""
    factors = list(factors)
    pooled = _gather(curves, factors, metric, compute, keys=factors)
    runs = _checked(curves, factors, metric, compute).drop_duplicates(_run_keys(curves, factors))
    params = np.full((len(pooled.keys), 3), np.nan)
    if np.isfinite(steepness):
        params, _, _ = _fitted(pooled, steepness)
    masks = cell_masks(pooled.keys, factors)
    counts = pd.Series(cell_masks(runs, factors)).value_counts()
    return pd.DataFrame({
        "cell": [cell_label(int(m), factors) for m in masks],
        **{f: (masks >> i) & 1 for i, f in enumerate(factors)},
        "runs": counts.reindex(masks).fillna(0).astype(int).to_numpy(),
        "r0": params[:, 0], "asymptote": params[:, 1], "midpoint": np.exp(params[:, 2]), "steepness": steepness,
    })  # fmt: skip


def _main_effects(runs: pd.DataFrame, factors: list[str], response: str, confidence: float) -> pd.DataFrame | None:
    """term, estimate, ci_low, ci_high, p_value of each factor's main effect on ``response`` (a
    column of per-run values), by the report's engine; None when the fitted runs cannot give them."""
    table = runs.loc[np.isfinite(runs[response].astype(float)), [*factors, SEED_COLUMN, response]]
    try:
        table = validate_results(table, factors, response)
        fit = fit_table(table, factors, response)
        design = describe_design(fit.masks, len(factors))
        contrasts = effect_contrasts(design, factors, fit.information(), max_order=1)
    except ReportInputError:
        return None
    if not contrasts.names:
        return None
    noise, _ = noise_model(fit, design, contrasts, confidence)
    est = estimate(fit, contrasts.contrasts, noise, confidence)
    by_term = {term[0]: i for i, term in enumerate(contrasts.terms) if len(term) == 1}
    index = [by_term.get(i, -1) for i in range(len(factors))]
    pick = lambda values: np.array([values[j] if j >= 0 else np.nan for j in index])  # noqa: E731
    return pd.DataFrame({"term": factors, "estimate": pick(est.estimate), "ci_low": pick(est.ci_low),
                         "ci_high": pick(est.ci_high), "p_value": pick(est.p_value)})  # fmt: skip


def verdicts(p_asymptote: np.ndarray, p_midpoint: np.ndarray, alpha: float) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(verdict per technique, Holm-adjusted p of the asymptote and midpoint effects): Holm over
    the 2 x k tests together.

    Example: p_A = (.001, .30), p_C = (.40, .004): sorted .001, .004, .30, .40 times 4, 3, 2, 1 ->
    .004, .012, .60, .60 (monotone): technique 1 moves the ceiling, technique 2 only the speed."""
    k = len(p_asymptote)
    adjusted = holm(np.concatenate([p_asymptote, p_midpoint]))
    adj_a, adj_c = adjusted[:k], adjusted[k:]
    out = []
    for pa, pc in zip(adj_a, adj_c):
        if np.isnan(pa) or np.isnan(pc):
            out.append(NOT_ENOUGH)
        else:
            moved = (pa < alpha, pc < alpha)
            out.append({(True, True): BOTH, (True, False): CEILING, (False, True): SPEED}.get(moved, NEITHER))
    return out, adj_a, adj_c


def technique_effects(runs: pd.DataFrame, factors: list[str], alpha: float = 0.05) -> pd.DataFrame:
    """CURVE_EFFECT_COLUMNS: each factor's main effect on the asymptote, on log C_mid and on the
    final metric (intervals at 1 - alpha), and its verdict (module docstring)."""
    fitted = runs[runs["fitted"]]
    parts = {name: _main_effects(fitted if name != "final" else runs, factors, name, 1 - alpha)
             for name in ("asymptote", "log_midpoint", "final")}  # fmt: skip
    empty = pd.DataFrame({"term": factors, **{c: np.nan for c in ("estimate", "ci_low", "ci_high", "p_value")}})
    a, c, f = (parts[name] if parts[name] is not None else empty for name in ("asymptote", "log_midpoint", "final"))
    verdict, adj_a, adj_c = verdicts(a["p_value"].to_numpy(float), c["p_value"].to_numpy(float), alpha)
    width_a = (a["ci_high"] - a["ci_low"]).to_numpy(float)
    width_c = (c["ci_high"] - c["ci_low"]).to_numpy(float)
    vague = ~((width_a <= MAX_ASYMPTOTE_CI) & (width_c <= np.log(MAX_MIDPOINT_RATIO_SPAN)))  # NaN counts as vague
    verdict = [NOT_ENOUGH if uninformative else v for v, uninformative in zip(verdict, vague)]
    return pd.DataFrame({
        "term": factors,
        "asymptote_effect": a["estimate"], "asymptote_ci_low": a["ci_low"], "asymptote_ci_high": a["ci_high"],
        "asymptote_p_adjusted": adj_a,
        "midpoint_log_effect": c["estimate"], "midpoint_ci_low": c["ci_low"], "midpoint_ci_high": c["ci_high"],
        "midpoint_p_adjusted": adj_c, "midpoint_ratio": np.exp(c["estimate"].to_numpy(float)),
        "final_effect": f["estimate"], "final_ci_low": f["ci_low"], "final_ci_high": f["ci_high"],
        "verdict": verdict,
    })[CURVE_EFFECT_COLUMNS]  # fmt: skip


@dataclass
class CurveAnalysis:
    """Compute curves of one experiment (see the module docstring)."""

    compute: str  # the compute axis: tokens_generated or gpu_hours
    steepness: float  # the shared B
    runs: pd.DataFrame  # per run (``fit_runs``)
    cells: pd.DataFrame  # per cell (``fit_cell_curves``)
    effects: pd.DataFrame  # CURVE_EFFECT_COLUMNS
    notes: list[str] = field(default_factory=list)


def analyze_curves(
    curves: pd.DataFrame,
    factors: list[str],
    metric: str = DEFAULT_METRIC,
    compute: str = "tokens_generated",
    alpha: float = 0.05,
) -> CurveAnalysis:
    """Fit every run and cell and estimate each technique's effects (module docstring).
    ReportInputError for a curves table that lacks a column or has impossible values."""
    factors = list(factors)
    runs, steepness = fit_runs(curves, factors, metric, compute)
    cells = fit_cell_curves(curves, factors, steepness, metric, compute)
    effects = technique_effects(runs, factors, alpha)
    notes = [
        f"Compute curves: {metric} against cumulative {compute} per run, R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) "
        f"with one steepness for all runs (B = {steepness:.3g}); effects on the asymptote A and on log C_mid (the "
        "compute to reach half the gain) from the per-run fits, seeds as replicates; Holm over both parameters."
    ]
    unfitted = int((~runs["fitted"]).sum())
    if unfitted:
        notes.append(
            f"{unfitted} of {len(runs)} runs have fewer than {MIN_POINTS} evaluations at 3 compute values: not fitted."
        )
    if runs["at_edge"].any():
        notes.append(
            f"{int(runs['at_edge'].sum())} runs reach half their gain beyond their data: their asymptote is an "
            "extrapolation."
        )
    fitted = runs[runs["fitted"]]
    unbent = fitted["at_edge"] | (fitted["midpoint"] > fitted["final_compute"])  # half the gain only past the data
    if len(fitted) and unbent.mean() > MAX_EDGE_SHARE:
        effects["verdict"] = NOT_ENOUGH
        notes.append(
            f"Most fitted runs ({int(unbent.sum())} of {len(fitted)}) have not bent toward a "
            "ceiling within the compute observed, so ceiling and speed cannot be told apart: every verdict is "
            "\"not enough data\" (train longer, past the bend)."
        )
    return CurveAnalysis(compute, steepness, runs, cells, effects, notes)
