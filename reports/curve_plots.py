"""The compute-curve figure: each cell's fitted saturating curve over its seeds' evaluations.

matplotlib through ``reports.plots`` (Agg backend; names drawn literally, never as TeX math).
One line per cell (``CurveAnalysis.cells``), the points of its runs behind it in the same colour,
compute on a log axis (the points at zero compute sit at the left edge), the asymptote of the
highest and lowest bent cells as dotted grey lines. Observed and predicted are told apart: a
cell's curve is solid up to the last compute its runs reached and dashed beyond it (an
extrapolation); a cell whose curve has not bent toward a ceiling within its data (half the gain
only past its last evaluation, or a ceiling outside the metric's range) is drawn dotted and
faded, its legend entry saying "not enough data" (``curve_bent``). Values in percentage points
when the metric is a fraction, like every other figure of the report.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.lines
import matplotlib.ticker
import numpy as np
import pandas as pd

from .compute_curves import CurveAnalysis, saturating_curve
from .plots import figure_png, literal_text, metric_scale, plt  # plt: pyplot once plots chose Agg
from .table import cell_masks

AXIS_LABELS = {"tokens_generated": "generated tokens (cumulative)", "gpu_hours": "GPU-hours (cumulative)"}


def _points(curves: pd.DataFrame, factors: list[str], metric: str, compute: str) -> pd.DataFrame:
    table = curves.dropna(subset=[compute, metric])
    return table.assign(_mask=cell_masks(table, factors))


def curve_bent(midpoint: float, asymptote: float, last_compute: float, percent: bool) -> bool:
    """Whether a fitted curve has bent toward its ceiling within the compute observed: half its gain
    reached by the last evaluation (midpoint <= last compute), with a ceiling inside the metric's
    range for an accuracy. Otherwise the ceiling and the speed trade off and the curve says "not
    enough data" (the rule ``compute_curves.analyze_curves`` applies to the verdicts)."""
    if not (np.isfinite(asymptote) and np.isfinite(midpoint)):
        return False
    return bool(midpoint <= last_compute and (not percent or 0 <= asymptote <= 1))


EXTRAPOLATED = {"linestyle": "--", "linewidth": 1.0}
"""How a curve is drawn past the compute its runs observed."""
NOT_BENT = {"linestyle": ":", "linewidth": 1.0, "alpha": 0.5}
"""How a curve that has not bent within its data is drawn (all of it: not enough data)."""


def curve_axes(analysis: CurveAnalysis, curves: pd.DataFrame, factors: list[str], metric: str, percent: bool):
    """The figure (matplotlib Figure, one axis): points and fitted curves per cell (module
    docstring). Cells without a fitted curve show their points only. Each fitted line carries a
    ``gid``: ``fit <cell>`` (within the compute observed), ``extrapolation <cell>`` (past it) or
    ``not bent <cell>``. The caller saves and closes it."""
    scale = metric_scale(percent)[0]
    compute = analysis.compute
    points = _points(curves, list(factors), metric, compute)
    positive = points.loc[points[compute] > 0, compute]
    low, high = (positive.min(), positive.max()) if len(positive) else (1.0, 10.0)
    grid = np.geomspace(low / 2, high * 1.5, 200)
    figure, axis = plt.subplots(figsize=(11, 5.2))
    colours = plt.get_cmap("tab20" if len(analysis.cells) > 10 else "tab10")
    masks = cell_masks(analysis.cells, list(factors))
    bent_asymptotes = []
    for i, (mask, cell) in enumerate(zip(masks, analysis.cells.itertuples(index=False))):
        own = points[points["_mask"] == mask]
        axis.scatter(np.maximum(own[compute], low / 2), own[metric] * scale, s=8, alpha=0.3, color=colours(i % colours.N))
        if _cell_curve(axis, cell, grid, own, compute, percent, colours(i % colours.N)):
            bent_asymptotes.append(cell.asymptote * scale)
    _dress(axis, analysis, points[metric].to_numpy(float) * scale, bent_asymptotes, metric, percent)
    figure.tight_layout()
    return figure


def _cell_curve(axis, cell, grid: np.ndarray, own: pd.DataFrame, compute: str, percent: bool, colour) -> bool:
    """One cell's fitted curve: solid within the compute its runs observed, dashed past it; dotted
    and faded when it has not bent within the data; a legend entry alone when not fitted. Whether
    it is a bent curve (its asymptote marks the figure's range of ceilings)."""
    scale = metric_scale(percent)[0]
    if not np.isfinite(cell.asymptote):
        axis.plot([], [], color=colour, label=f"{cell.cell} (not fitted)")
        return False
    last = float(own[compute].max()) if len(own) else float("nan")
    curve = saturating_curve(grid, cell.r0, cell.asymptote, cell.midpoint, cell.steepness) * scale
    if not curve_bent(cell.midpoint, cell.asymptote, last, percent):
        axis.plot(grid, curve, color=colour, gid=f"not bent {cell.cell}",
                  label=f"{cell.cell} (not bent within the data: not enough data)", **NOT_BENT)  # fmt: skip
        return False
    inside = grid <= last
    edge = np.searchsorted(grid, last)  # the two parts meet at the last compute observed
    seen_x, past_x = np.append(grid[inside], last), np.insert(grid[edge:], 0, last)
    at_last = saturating_curve([last], cell.r0, cell.asymptote, cell.midpoint, cell.steepness) * scale
    axis.plot(seen_x, np.append(curve[inside], at_last), color=colour, gid=f"fit {cell.cell}",
              label=f"{cell.cell} ({_asymptote_text(cell.asymptote, scale, percent)})")  # fmt: skip
    axis.plot(past_x, np.insert(curve[edge:], 0, at_last), color=colour, gid=f"extrapolation {cell.cell}",
              **EXTRAPOLATED)  # fmt: skip
    return True


def _dress(axis, analysis: CurveAnalysis, seen: np.ndarray, bent_asymptotes: list[float], metric: str, percent: bool) -> None:
    """Limits, scales, labels, the lowest and highest bent ceilings, and the legend with a key to
    the line styles drawn. The y axis fits the evaluations (`seen`, scaled): a curve that has not
    bent toward its ceiling within the data runs off the top rather than squashing them."""
    seen = seen[np.isfinite(seen)]
    if len(seen):
        pad = 0.15 * (seen.max() - seen.min()) if seen.max() > seen.min() else 1.0
        low_y, high_y = seen.min() - pad, seen.max() + pad
        axis.set_ylim(max(low_y, 0.0) if percent else low_y, min(high_y, 100.0) if percent else high_y)
    for value in (min(bent_asymptotes), max(bent_asymptotes)) if bent_asymptotes else ():
        if axis.get_ylim()[0] <= value <= axis.get_ylim()[1]:
            axis.axhline(value, color="grey", linestyle=":", linewidth=0.8)
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))  # 20k 50k 100k ...
    axis.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axis.set_xlabel(AXIS_LABELS.get(analysis.compute, analysis.compute))
    axis.set_ylabel(f"{metric}{metric_scale(percent)[1]}")
    axis.set_title(f"Fitted compute curves per cell (shared steepness B = {analysis.steepness:.3g})"
                   if np.isfinite(analysis.steepness) else
                   "Compute per cell: evaluations only (no run has the 4 evaluations a fit needs)", fontsize=10)  # fmt: skip
    handles, labels = axis.get_legend_handles_labels()
    drawn = {line.get_gid().split(" ", 1)[0] for line in axis.get_lines() if line.get_gid()}
    styles = [("fit", "fitted, within the compute observed", {"linestyle": "-", "linewidth": 1.5}),
              ("extrapolation", "extrapolated past the last evaluation", EXTRAPOLATED),
              ("not", "not bent within the data: not enough data", NOT_BENT)]  # fmt: skip
    for kind, label, style in styles:  # a key to the line styles the figure uses
        if kind in drawn:
            handles.append(matplotlib.lines.Line2D([], [], color="grey", **style))
            labels.append(label)
    axis.legend(handles, labels, fontsize=7, ncol=2 if len(analysis.cells) > 16 else 1, loc="upper left",
                bbox_to_anchor=(1.01, 1.0), title="cell (asymptote A); line styles", title_fontsize=7,
                frameon=False)  # fmt: skip


def _asymptote_text(asymptote: float, scale: float, percent: bool) -> str:
    """The legend's word on a cell's ceiling: "A 56.3", or that the fit puts it past the metric's range."""
    if not np.isfinite(asymptote):
        return "not fitted"
    if percent and not 0 <= asymptote <= 1:
        return "no ceiling in the data"
    return f"A {asymptote * scale:.3g}"


@literal_text
def curve_png(analysis: CurveAnalysis, curves: pd.DataFrame, factors: list[str], metric: str, percent: bool) -> bytes:
    """``curve_axes`` as PNG bytes (the report's compute_curves.png), rendered as every report figure is."""
    return figure_png(curve_axes(analysis, curves, factors, metric, percent))


@literal_text
def curve_figure(
    analysis: CurveAnalysis, curves: pd.DataFrame, factors: list[str], path: str | Path, metric: str,
    percent: bool = True,
) -> Path:
    """Write the figure (PNG or any format matplotlib infers from ``path``'s suffix); returns the path."""
    figure = curve_axes(analysis, curves, factors, metric, percent)
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
