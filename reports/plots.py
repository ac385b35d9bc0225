"""PNG figures (matplotlib, Agg backend: no display needed). Each returns PNG bytes or None.

Values are drawn in percentage points when the metric is a fraction, like the tables.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .table import cell_masks, factor_label  # noqa: E402


def figure_png(figure) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it."""
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def _scale(percent: bool) -> tuple[float, str]:
    return (100.0, " (pp)") if percent else (1.0, "")


def _error_bars(center: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray | None:
    if np.isnan(low).all():
        return None
    return np.nan_to_num(np.vstack([center - low, high - center]))


def shapley_plot(shapley: pd.DataFrame, metric: str, percent: bool, confidence: float) -> bytes | None:
    """Bars of Shapley and Banzhaf values per factor, with their confidence intervals."""
    if shapley["shapley"].isna().all():
        return None
    scale, unit = _scale(percent)
    x = np.arange(len(shapley))
    figure, axis = plt.subplots(figsize=(1.4 * len(x) + 2.5, 3.6))
    for offset, column, low, high, label in (
        (-0.2, "shapley", "ci_low", "ci_high", "Shapley (mean over orderings)"),
        (0.2, "banzhaf", "banzhaf_ci_low", "banzhaf_ci_high", "Banzhaf (= main effect)"),
    ):
        center = shapley[column].to_numpy() * scale
        bars = _error_bars(center, shapley[low].to_numpy() * scale, shapley[high].to_numpy() * scale)
        axis.bar(x + offset, center, width=0.38, yerr=bars, capsize=3, label=label)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xticks(x, [factor_label(f) for f in shapley["factor"]])
    axis.set_ylabel(f"gain in {metric}{unit}")
    axis.set_title(f"Attribution per factor, {confidence:.0%} CIs")
    axis.legend(fontsize=8)
    return figure_png(figure)


def position_plot(orderings: pd.DataFrame, metric: str, percent: bool) -> bytes | None:
    """Mean gain of each factor by the position at which an ordering adds it, with CIs."""
    by_position = orderings[orderings["position"] != "all"]
    if by_position.empty:
        return None
    scale, unit = _scale(percent)
    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    factors = list(dict.fromkeys(by_position["factor"]))
    for j, factor in enumerate(factors):
        rows = by_position[by_position["factor"] == factor]
        x = rows["position"].astype(int).to_numpy() + 0.06 * (j - len(factors) / 2)
        mean = rows["mean"].to_numpy() * scale
        bars = _error_bars(mean, rows["ci_low"].to_numpy() * scale, rows["ci_high"].to_numpy() * scale)
        axis.errorbar(x, mean, yerr=bars, marker="o", capsize=2, label=factor_label(factor))
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xticks(range(1, len(factors) + 1))
    axis.set_xlabel("position at which the factor is added")
    axis.set_ylabel(f"mean gain in {metric}{unit}")
    axis.set_title("Order dependence: gain by position")
    axis.legend(fontsize=8, ncol=min(len(factors), 5))
    return figure_png(figure)


def interaction_plot(effects: pd.DataFrame, factors: list[str], percent: bool) -> bytes | None:
    """Heatmap of two-factor interaction effects (colour); main effects written on the diagonal.

    The colour scale follows the interactions only, so a large main effect does not wash them
    out. A star marks a family-adjusted p < 0.05. An alias chain is drawn at its first member.
    """
    if effects.empty or effects["effect"].isna().all():
        return None
    scale, unit = _scale(percent)
    k = len(factors)
    grid = np.full((k, k), np.nan)
    text = np.full((k, k), "", dtype=object)
    for row in effects.itertuples(index=False):
        names = row.term.split(" = ")[0].split(":")
        i, j = factors.index(names[0]), factors.index(names[-1])
        value = row.effect * scale
        label = (f"{value:.1f}" if percent else f"{value:.3g}") + ("*" if row.p_adjusted < 0.05 else "")
        text[i, j] = text[j, i] = label
        if i != j:
            grid[i, j] = grid[j, i] = value
    limit = np.nanmax(np.abs(grid)) if np.isfinite(grid).any() else 1.0
    colours = plt.get_cmap("RdBu").with_extremes(bad="#eeeeee")
    figure, axis = plt.subplots(figsize=(1.0 * k + 2.5, 0.9 * k + 1.6))
    image = axis.imshow(grid, cmap=colours, vmin=-limit or -1, vmax=limit or 1)
    for i in range(k):
        for j in range(k):
            dark = abs(np.nan_to_num(grid[i, j])) > 0.6 * limit
            axis.text(
                j,
                i,
                text[i, j],
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
                fontweight="bold" if i == j else "normal",
            )
    labels = [factor_label(f) for f in factors]
    axis.set_xticks(range(k), labels)
    axis.set_yticks(range(k), labels)
    figure.colorbar(image, ax=axis, label=f"interaction effect{unit}")
    axis.set_title("Two-factor interactions (diagonal: main effects)", fontsize=10)
    return figure_png(figure)


def curves_plot(curves: pd.DataFrame, factors: list[str], metric: str, percent: bool) -> bytes | None:
    """Each cell's learning curve (mean over seeds), coloured by how many factors are on.

    ``curves``: one row per (cell, seed, step) with the factor columns, ``seed``, ``step`` and
    the metric, already checked by ``table.validate_curves``.
    """
    scale, unit = _scale(percent)
    table = curves.assign(_mask=cell_masks(curves, factors))
    mean = table.groupby(["_mask", "step"])[metric].mean().reset_index()
    k = len(factors)
    colours = plt.get_cmap("viridis")
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for mask, rows in mean.groupby("_mask"):
        on = bin(int(mask)).count("1")
        axis.plot(rows["step"], rows[metric] * scale, color=colours(on / max(k, 1)), linewidth=1.0, alpha=0.8)
    for on in range(k + 1):
        axis.plot([], [], color=colours(on / max(k, 1)), label=f"{on} on")
    axis.set_xlabel("training step")
    axis.set_ylabel(f"{metric}{unit}")
    axis.set_title("Learning curves per cell (mean over seeds)")
    axis.legend(fontsize=7, title="factors", title_fontsize=7, ncol=2)
    return figure_png(figure)


def forest_plot(transfer: pd.DataFrame, statistic: str, metric: str, percent: bool, confidence: float) -> bytes | None:
    """Forest plot: each term's estimate with its CI in every setting (one row per term, one
    marker per setting, offset vertically), and the verdict beside the term."""
    rows = transfer[transfer["statistic"] == statistic]
    if rows.empty or rows["estimate"].isna().all():
        return None
    scale, unit = _scale(percent)
    terms = list(dict.fromkeys(rows["term"]))
    settings = list(dict.fromkeys(rows["setting"]))
    figure, axis = plt.subplots(figsize=(7.5, 0.55 * len(terms) * max(len(settings), 2) / 2 + 1.6))
    step = 0.7 / max(len(settings), 1)
    for s, setting in enumerate(settings):
        part = rows[rows["setting"] == setting].set_index("term").reindex(terms)
        y = np.arange(len(terms)) + (s - (len(settings) - 1) / 2) * step
        center = part["estimate"].to_numpy(float) * scale
        bars = _error_bars(center, part["ci_low"].to_numpy(float) * scale, part["ci_high"].to_numpy(float) * scale)
        axis.errorbar(center, y, xerr=bars, fmt="o", capsize=3, markersize=4, label=setting)
    verdicts = rows.drop_duplicates("term").set_index("term")["verdict"].reindex(terms)
    labels = [f"{':'.join(factor_label(f) for f in t.split(':'))}\n({v})" for t, v in zip(terms, verdicts)]
    axis.set_yticks(np.arange(len(terms)), labels, fontsize=8)
    axis.invert_yaxis()
    axis.axvline(0, color="black", linewidth=0.8)
    axis.set_xlabel(f"{statistic} of {metric}{unit}")
    axis.set_title(f"{statistic} per setting, {confidence:.0%} CIs")
    axis.legend(fontsize=8, loc="best")
    return figure_png(figure)
