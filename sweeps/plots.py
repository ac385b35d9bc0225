"""PNG figures of a sweep report (matplotlib, Agg backend). Each returns PNG bytes or None."""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dapo_ablate.reports.plots import figure_png  # noqa: E402

if TYPE_CHECKING:
    from dapo_ablate.sweeps.report_data import SweepReport


def history_plot(report: SweepReport) -> bytes | None:
    """Each trial's value (pruned: its last intermediate value) and the best so far."""
    trials = report.trials
    shown = trials[trials["state"].isin(["COMPLETE", "PRUNED"]) & trials[report.metric].notna()]
    if shown.empty:
        return None
    figure, axis = plt.subplots(figsize=(6.5, 3.6))
    for state, marker, label in (("COMPLETE", "o", "complete"), ("PRUNED", "x", "pruned (last reported)")):
        sub = shown[shown["state"] == state]
        if not sub.empty:
            axis.scatter(sub["trial"], sub[report.metric], marker=marker, label=label)
    complete = shown[shown["state"] == "COMPLETE"].sort_values("trial")
    if not complete.empty:
        values = complete[report.metric].to_numpy(dtype=float)
        best = np.maximum.accumulate(values) if report.direction == "maximize" else np.minimum.accumulate(values)
        axis.step(complete["trial"], best, where="post", color="black", linewidth=1, label="best so far")
    axis.set_xlabel("trial")
    axis.set_ylabel(report.metric)
    axis.set_title(f"{report.name}: {report.metric} by trial")
    axis.legend(fontsize=8)
    return figure_png(figure)


def importance_plot(report: SweepReport) -> bytes | None:
    """fANOVA importance of each knob, one bar group per target (objective, each effect)."""
    table = report.importances
    if table.empty:
        return None
    targets = list(dict.fromkeys(table["target"]))
    knobs = list(dict.fromkeys(table["knob"]))
    y = np.arange(len(knobs))
    height = 0.8 / len(targets)
    figure, axis = plt.subplots(figsize=(6.5, 0.5 * len(knobs) * len(targets) + 1.6))
    for i, target in enumerate(targets):
        sub = table[table["target"] == target].set_index("knob").reindex(knobs)
        axis.barh(y + i * height, sub["importance"].fillna(0), height=height, label=target)
    axis.set_yticks(y + height * (len(targets) - 1) / 2, knobs)
    axis.set_xlabel("importance (fANOVA, sums to 1 per target)")
    axis.legend(fontsize=8)
    return figure_png(figure)


def effects_plot(report: SweepReport) -> bytes | None:
    """Each factor's effect (rows) against each knob (columns), with 95% CIs over seeds."""
    effects = report.effects
    if effects is None or effects.empty:
        return None
    factors, knobs = report.factors, report.knobs
    figure, axes = plt.subplots(len(factors), len(knobs), figsize=(3.4 * len(knobs) + 0.6, 2.8 * len(factors) + 0.4),
                                squeeze=False)
    for row, factor in enumerate(factors):
        sub = effects[effects["factor"] == factor]
        for col, knob in enumerate(knobs):
            axis = axes[row][col]
            x, labels = _positions(sub[knob])
            center = sub["effect"].to_numpy(dtype=float)
            low = pd.to_numeric(sub["ci_low"], errors="coerce").to_numpy(dtype=float)
            high = pd.to_numeric(sub["ci_high"], errors="coerce").to_numpy(dtype=float)
            bars = None if np.isnan(low).all() else np.nan_to_num(np.vstack([center - low, high - center]))
            axis.errorbar(x, center, yerr=bars, fmt="o", capsize=3, markersize=4)
            axis.axhline(0, color="black", linewidth=0.8)
            if labels is not None:
                axis.set_xticks(range(len(labels)), labels)
            axis.set_xlabel(knob)
            if col == 0:
                axis.set_ylabel(f"effect of {factor}\non {report.metric}")
    figure.suptitle(f"{report.name}: factor effects across knob settings (95% CI over seeds)", fontsize=10)
    return figure_png(figure)


def _positions(values: pd.Series) -> tuple[np.ndarray, list[str] | None]:
    """Numeric knob values as they are; anything else as category positions with labels."""
    numeric = pd.to_numeric(values, errors="coerce")
    if numeric.notna().all() and not values.map(lambda v: isinstance(v, bool)).any():
        return numeric.to_numpy(dtype=float), None
    labels = sorted({str(v) for v in values})
    return np.array([labels.index(str(v)) for v in values], dtype=float), labels
