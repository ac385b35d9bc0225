"""The compute-curve figure: each cell's fitted saturating curve over its seeds' evaluations.

matplotlib through ``reports.plots`` (Agg backend; names drawn literally, never as TeX math).
One line per cell (``CurveAnalysis.cells``), the points of its runs behind it in the same colour, compute on a log axis (the points at zero compute sit at the left
edge), the asymptote of the highest and lowest cells as dotted lines. Values in percentage points
when the metric is a fraction, like every other figure of the report.
"""

from __future__ import annotations

from pathlib import Path

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


def curve_axes(analysis: CurveAnalysis, curves: pd.DataFrame, factors: list[str], metric: str, percent: bool):
    """The figure (matplotlib Figure, one axis): points and fitted curves per cell. Cells without
    a fitted curve show their points only. The caller saves and closes it."""
    scale, unit = metric_scale(percent)
    compute = analysis.compute
    points = _points(curves, list(factors), metric, compute)
    positive = points.loc[points[compute] > 0, compute]
    low, high = (positive.min(), positive.max()) if len(positive) else (1.0, 10.0)
    grid = np.geomspace(low / 2, high * 1.5, 200)
    figure, axis = plt.subplots(figsize=(11, 5.2))
    colours = plt.get_cmap("tab20" if len(analysis.cells) > 10 else "tab10")
    masks = cell_masks(analysis.cells, list(factors))
    for i, (mask, cell) in enumerate(zip(masks, analysis.cells.itertuples(index=False))):
        colour = colours(i % colours.N)
        own = points[points["_mask"] == mask]
        axis.scatter(np.maximum(own[compute], low / 2), own[metric] * scale, s=8, alpha=0.3, color=colour)
        label = f"{cell.cell} ({_asymptote_text(cell.asymptote, scale, percent)})"
        if np.isfinite(cell.asymptote):
            curve = saturating_curve(grid, cell.r0, cell.asymptote, cell.midpoint, cell.steepness)
            axis.plot(grid, curve * scale, color=colour, label=label)
        else:
            axis.plot([], [], color=colour, label=label)
    # the y axis fits the evaluations (a curve that has not bent toward its ceiling within the data
    # runs off the top rather than squashing them), inside the metric's range for an accuracy
    seen = points[metric].to_numpy(float) * scale
    seen = seen[np.isfinite(seen)]
    if len(seen):
        pad = 0.15 * (seen.max() - seen.min()) if seen.max() > seen.min() else 1.0
        low_y, high_y = seen.min() - pad, seen.max() + pad
        axis.set_ylim(max(low_y, 0.0) if percent else low_y, min(high_y, 100.0) if percent else high_y)
    fitted = analysis.cells["asymptote"].dropna() * scale
    for value in (fitted.min(), fitted.max()) if len(fitted) else ():
        if axis.get_ylim()[0] <= value <= axis.get_ylim()[1]:
            axis.axhline(value, color="grey", linestyle=":", linewidth=0.8)
    axis.set_xscale("log")
    axis.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))  # 20k 50k 100k ...
    axis.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axis.set_xlabel(AXIS_LABELS.get(compute, compute))
    axis.set_ylabel(f"{metric}{unit}")
    axis.set_title(f"Fitted compute curves per cell (shared steepness B = {analysis.steepness:.3g})"
                   if np.isfinite(analysis.steepness) else
                   "Compute per cell: evaluations only (no run has the 4 evaluations a fit needs)", fontsize=10)  # fmt: skip
    axis.legend(fontsize=7, ncol=2 if len(analysis.cells) > 16 else 1, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                title="cell (asymptote A)", title_fontsize=7, frameon=False)  # fmt: skip
    figure.tight_layout()
    return figure


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
