"""The compute-curve figure: each cell's fitted saturating curve over its seeds' evaluations.

matplotlib with the Agg backend, imported inside the function (a report without curves, and
``--help``, never pay for it). One line per cell (``CurveAnalysis.cells``), the points of its runs
behind it in the same colour, compute on a log axis (the points at zero compute sit at the left
edge), the asymptote of the highest and lowest cells as dotted lines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .compute_curves import CurveAnalysis, saturating_curve
from .table import cell_masks

AXIS_LABELS = {"tokens_generated": "generated tokens (cumulative)", "gpu_hours": "GPU-hours (cumulative)"}


def _points(curves: pd.DataFrame, factors: list[str], metric: str, compute: str) -> pd.DataFrame:
    table = curves.dropna(subset=[compute, metric])
    return table.assign(_mask=cell_masks(table, factors))


def curve_figure(
    analysis: CurveAnalysis, curves: pd.DataFrame, factors: list[str], path: str | Path, metric: str
) -> Path:
    """Write the figure (PNG or any format matplotlib infers from ``path``'s suffix); returns the path.
    Cells without a fitted curve show their points only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compute = analysis.compute
    points = _points(curves, list(factors), metric, compute)
    positive = points.loc[points[compute] > 0, compute]
    low, high = (positive.min(), positive.max()) if len(positive) else (1.0, 10.0)
    grid = np.geomspace(low / 2, high * 1.5, 200)
    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.get_cmap("tab20" if len(analysis.cells) > 10 else "tab10")
    masks = cell_masks(analysis.cells, list(factors))
    for i, (mask, cell) in enumerate(zip(masks, analysis.cells.itertuples(index=False))):
        colour = colours(i % colours.N)
        own = points[points["_mask"] == mask]
        ax.scatter(np.maximum(own[compute], low / 2), own[metric], s=8, alpha=0.3, color=colour)
        if np.isfinite(cell.asymptote):
            curve = saturating_curve(grid, cell.r0, cell.asymptote, cell.midpoint, cell.steepness)
            ax.plot(grid, curve, color=colour, label=f"{cell.cell} (A {cell.asymptote:.3g})")
    fitted = analysis.cells["asymptote"].dropna()
    for value in (fitted.min(), fitted.max()) if len(fitted) else ():
        ax.axhline(value, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(AXIS_LABELS.get(compute, compute))
    ax.set_ylabel(metric)
    ax.set_title(f"Fitted compute curves per cell (shared steepness B = {analysis.steepness:.3g})")
    ax.legend(fontsize=7, ncol=2 if len(analysis.cells) > 8 else 1, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
