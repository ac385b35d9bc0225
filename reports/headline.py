"""The headline of a factorial: full DAPO vs the baseline (GRPO) with its interval, and the best cells.

Both come from the report's one inference engine (``inference.estimate``): the gain is the
exact contrast mu(full) - mu(baseline) of the fitted cell means, with the SE, df and method
every other statistic of the report gets; a cell's comparison with full DAPO is the contrast
mu(cell) - mu(full). A resolution V+ fraction reads unobserved cells from its fitted model,
like the Shapley values do; a design that lacks the full or the baseline cell has no headline
gain (NaN), and says so.

The best cells are the observed cells with the highest estimated means. They are picked after
seeing the data, so a best cell "beating" full DAPO by a small margin is expected by chance: the
sentences give the comparison's own (unadjusted) interval and say so.

``log_parent_headline`` puts the headline on the experiment's MLflow parent run (metrics
``headline/full_vs_baseline``, ``headline/ci_low``, ``headline/ci_high``, ...; tag
``dapo.headline.best_cell``). It takes the tracker as an argument so that this package imports
neither ``dapo_ablate.ablation`` nor MLflow (docs/contracts.md: reports read a results table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .analysis import Analysis, CellValues, analyze, noise_model
from .claims import amount, interval
from .effects import effect_contrasts
from .inference import estimate
from .table import cell_label, is_paper_design

TOP_CELLS = 3
"""How many best cells the summary names."""
BEST_CELL_TAG = "dapo.headline.best_cell"
HEADLINE_TAG = "dapo.headline"


@dataclass(frozen=True)
class Comparison:
    """One contrast of cell means: estimate, interval and two-sided p-value (NaN when not estimable)."""

    estimate: float
    ci_low: float
    ci_high: float
    p_value: float

    @property
    def excludes_zero(self) -> bool:
        return bool(self.ci_low > 0 or self.ci_high < 0)


@dataclass(frozen=True)
class BestCell:
    """An observed cell among the best: its mean with CI, and its difference from full DAPO."""

    label: str
    mean: Comparison  # the cell's estimated mean (a level, not a contrast; p_value is NaN)
    vs_full: Comparison  # mu(cell) - mu(full); NaN when the full cell is not estimable
    is_full: bool


@dataclass(frozen=True)
class Headline:
    """Full vs baseline with its interval, and the best cells (best first)."""

    metric: str
    percent: bool  # the metric is a fraction: shown in percentage points
    confidence: float
    full_name: str  # "full DAPO (OF+CH+SP+TL+DS)" or "all factors on (a+b)"
    baseline_name: str  # "GRPO" or "baseline (all off)"
    full_mean: float
    baseline_mean: float
    gain: Comparison  # mu(full) - mu(baseline)
    best: tuple[BestCell, ...]
    above_full: int  # observed cells whose estimated mean is above the full cell's
    n_cells: int  # observed cells
    full_observed: bool = True  # the full cell was run (else its mean is the fitted model's prediction)
    baseline_observed: bool = True  # the baseline cell was run

    @property
    def predicted(self) -> list[str]:
        """The names of the headline's cells that were not run (their means are predictions)."""
        return [name for name, seen in ((self.full_name, self.full_observed), (self.baseline_name, self.baseline_observed))
                if not seen]

    @property
    def beat_full(self) -> tuple[BestCell, ...]:
        """The best cells whose estimated mean is above full DAPO's."""
        return tuple(cell for cell in self.best if not cell.is_full and cell.vs_full.estimate > 0)


def cell_values(analysis: Analysis) -> CellValues:
    """All 2^k cell means of ``analysis`` as the engine sees them (observed cells, a resolution V+
    fraction's fitted ones, NaN elsewhere), with the analysis's own noise estimate."""
    if analysis.values is not None:
        return analysis.values
    contrasts = effect_contrasts(analysis.design, analysis.factors, analysis.fit.information())
    noise, _ = noise_model(analysis.fit, analysis.design, contrasts, analysis.confidence)
    return CellValues(analysis.fit, analysis.design, noise, analysis.confidence)


def _compare(values: CellValues, statistic) -> Comparison:
    """The engine's estimate of one linear statistic of the 2^k cell means."""
    rows = values.contrasts(statistic)
    if np.isnan(rows).any():
        return Comparison(float("nan"), float("nan"), float("nan"), float("nan"))
    est = estimate(values.fit, rows, values.noise, values.confidence)
    return Comparison(float(est.estimate[0]), float(est.ci_low[0]), float(est.ci_high[0]), float(est.p_value[0]))


def _difference(a: int, b: int):
    """The statistic mu(a) - mu(b) over cell means [..., 2**k] -> [..., 1]."""
    return lambda v: v[..., [a]] - v[..., [b]]


def baseline_name(held_on: tuple[str, ...] = ()) -> str:
    """The all-off cell, named by what is on in it: techniques the base config keeps on throughout."""
    return f"baseline (all factors off; {', '.join(held_on)} on throughout)" if held_on else "baseline (all off)"


def headline(analysis: Analysis, top: int = TOP_CELLS) -> Headline:
    """Full vs baseline and the ``top`` best observed cells of ``analysis`` (module docstring)."""
    factors, values = analysis.factors, cell_values(analysis)
    full = 2 ** len(factors) - 1
    paper = is_paper_design(factors)
    full_label = cell_label(full, factors)
    best = []
    cells = analysis.cells.assign(cell_mask=analysis.fit.masks).sort_values("mean", ascending=False, kind="stable")
    for row in cells.head(top).itertuples(index=False):
        best.append(
            BestCell(
                label=row.cell,
                mean=Comparison(float(row.mean), float(row.ci_low), float(row.ci_high), float("nan")),
                vs_full=_compare(values, _difference(int(row.cell_mask), full)),
                is_full=int(row.cell_mask) == full,
            )
        )
    return Headline(
        metric=analysis.metric,
        percent=analysis.percent,
        confidence=analysis.confidence,
        full_name=f"full DAPO ({full_label})" if paper else f"all factors on ({full_label})",
        baseline_name="GRPO" if paper else baseline_name(analysis.held_on),
        full_mean=float(values.point[full]),
        baseline_mean=float(values.point[0]),
        gain=_compare(values, _difference(full, 0)),
        best=tuple(best),
        above_full=int((analysis.cells["mean"] > values.point[full]).sum()),
        n_cells=len(analysis.cells),
        full_observed=full in set(int(m) for m in analysis.fit.masks),
        baseline_observed=0 in set(int(m) for m in analysis.fit.masks),
    )


def _level(value: float, percent: bool) -> str:
    return f"{100 * value:.1f}" if percent else f"{value:.4g}"


def _p(p_value: float) -> str:
    return f", p = {p_value:.2g}" if np.isfinite(p_value) else ""


def headline_lines(h: Headline) -> list[str]:
    """The summary's opening lines: the gain with its interval, then the best cells."""
    conf = f"{h.confidence:.0%} CI"
    if np.isfinite(h.gain.estimate):
        gain = (
            f"{h.full_name[0].upper()}{h.full_name[1:]} vs {h.baseline_name}: {amount(h.gain.estimate, h.percent)} "
            f"{interval(h.gain.ci_low, h.gain.ci_high, h.percent)} ({conf}{_p(h.gain.p_value)}); {h.metric} "
            f"{_level(h.full_mean, h.percent)} vs {_level(h.baseline_mean, h.percent)}"
            + (f"; PREDICTED: {' and '.join(h.predicted)} not run, its mean is the fitted model's prediction."
               if h.predicted else ".")
        )
    else:
        gain = (
            f"{h.full_name[0].upper()}{h.full_name[1:]} vs {h.baseline_name}: not estimable, the design lacks one of "
            "the two cells."
        )
    lines = [gain]
    if h.best:
        listed = "; ".join(
            f"{cell.label}{' (full)' if cell.is_full else ''} {_level(cell.mean.estimate, h.percent)} "
            f"{interval(cell.mean.ci_low, cell.mean.ci_high, h.percent)}"
            for cell in h.best
        )
        lines.append(f"Best cells by {h.metric} ({conf}): {listed}.")
    if h.beat_full:
        each = ", ".join(
            f"{cell.label} {amount(cell.vs_full.estimate, h.percent)} "
            f"{interval(cell.vs_full.ci_low, cell.vs_full.ci_high, h.percent)}"
            + (f" (p = {cell.vs_full.p_value:.2g})" if np.isfinite(cell.vs_full.p_value) else "")
            for cell in h.beat_full
        )
        clear = [cell.label for cell in h.beat_full if cell.vs_full.excludes_zero]
        if not clear:
            verdict = "none is distinguishable from full with these seeds"
        elif len(clear) == 1:
            verdict = f"the interval of {clear[0]} excludes zero"
        else:
            verdict = f"the intervals of {', '.join(clear)} exclude zero"
        lines.append(
            f"{h.above_full} of {h.n_cells} cells have a higher mean than {h.full_name}; the best vs full: {each}; "
            f"{verdict} (unadjusted intervals: the best cells are picked after seeing the data)."
        )
    return lines


def headline_metrics(h: Headline, prefix: str = "headline/", keep_nan: bool = False) -> dict[str, float]:
    """The headline as MLflow metrics (fractions, as stored): ``<prefix>full_observed`` and
    ``baseline_observed`` (1: the cell was run; 0: its mean is the fitted model's prediction), ``full_vs_baseline``,
    ``ci_low``, ``ci_high``, ``p_value``, ``full``, ``baseline``, ``best_cell_<metric>`` and its
    ``best_cell_ci_low`` / ``best_cell_ci_high``, ``best_vs_full``. NaN values are left out, unless
    `keep_nan` (a headline replacing an earlier one logs every key, NaN where it has no value)."""
    metrics = {
        "full_observed": float(h.full_observed),  # 0: the full cell was not run (its mean is predicted)
        "baseline_observed": float(h.baseline_observed),
        "full_vs_baseline": h.gain.estimate,
        "ci_low": h.gain.ci_low,
        "ci_high": h.gain.ci_high,
        "p_value": h.gain.p_value,
        "full": h.full_mean,
        "baseline": h.baseline_mean,
    }
    top = h.best[0] if h.best else None
    nan = float("nan")
    metrics |= {
        f"best_cell_{h.metric}": top.mean.estimate if top else nan,
        "best_cell_ci_low": top.mean.ci_low if top else nan,
        "best_cell_ci_high": top.mean.ci_high if top else nan,
        "best_vs_full": top.vs_full.estimate if top else nan,
    }
    return {prefix + key: float(value) for key, value in metrics.items() if keep_nan or np.isfinite(value)}


def headlines(
    results: pd.DataFrame, factors: list[str], metric: str, confidence: float = 0.95
) -> dict[str, Headline]:
    """Setting name -> headline ("" for a results table without a ``setting`` column); raises
    ReportInputError like ``analyze`` when a setting's results cannot be analysed."""
    if "setting" not in results.columns:
        return {"": headline(analyze(results, factors, metric=metric, confidence=confidence))}
    return {
        str(name): headline(analyze(part.drop(columns="setting"), factors, metric=metric, confidence=confidence))
        for name, part in results.groupby("setting", sort=False)
    }


def headline_record(found: dict[str, Headline]) -> tuple[dict[str, float], dict[str, str]]:
    """The parent run's headline metrics and tags for the headlines by setting ("" without
    settings), as one unit: every metric key (NaN where there is no value: an interval that is not
    estimable clears the earlier bound) and every tag ("" for a best cell there is none of)."""
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    for setting, h in found.items():
        metrics |= headline_metrics(h, f"headline/{setting}/" if setting else "headline/", keep_nan=True)
        suffix = f".{setting}" if setting else ""
        tags[BEST_CELL_TAG + suffix] = h.best[0].label if h.best else ""
        tags[HEADLINE_TAG + suffix] = headline_lines(h)[0]
    return metrics, tags


def log_parent_headline(
    tracker: Any,
    parent_id: str,
    results: pd.DataFrame,
    factors: list[str],
    metric: str,
    confidence: float = 0.95,
) -> dict[str, Headline]:
    """Compute the headline of ``results`` and log it to the MLflow parent run ``parent_id``.

    ``tracker``: a ``dapo_ablate.ablation.store.tracking.Tracker`` (or anything with its
    ``log_parent_metrics(parent_id, metrics)`` and an MLflow ``client``). Logs the metrics of
    ``headline_metrics`` (a transfer study: one set per setting, ``headline/<setting>/...``), the
    tag ``dapo.headline.best_cell`` (the best cell's label; per setting ``.../<setting>``) and the
    tag ``dapo.headline`` (the opening sentence). Returns the headlines by setting.
    Every key is logged, NaN (metrics) or "" (the best cell tag) where this headline has no value,
    so no value of an earlier headline stays beside this one's (`headline_record`). Raises
    ReportInputError (nothing logged) when the results cannot be analysed.
    """
    found = headlines(results, factors, metric, confidence)
    metrics, tags = headline_record(found)
    tracker.log_parent_metrics(parent_id, metrics)
    for key, value in tags.items():
        tracker.client.set_tag(parent_id, key, value)
    return found
