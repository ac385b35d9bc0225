"""Figures of a sweep report (matplotlib, Agg backend).

Each ``*_figure`` builds a matplotlib Figure (or None when there is nothing to draw) so that tests
can read its layout; `render_figures` turns them into PNG bytes by file name. How they read:

- metric values in percentage points when the metric is a fraction, "(pp)" in the axis label;
- a knob sampled on a log scale gets a log x axis, every knob's ticks its values rounded
  (``3.2e-4``, ``0.25``), a categorical knob its choices in order;
- trial numbers are integers on the history's axis;
- importances from fewer than `RELIABLE_IMPORTANCE_TRIALS` complete trials carry a red warning;
- error bars only where seeds give an interval; with one seed the title promises none.

Names are user text, so math parsing is off while a figure is built and drawn (``$`` drawn as is).
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter  # noqa: E402

from dapo_ablate.reports.plots import figure_png  # noqa: E402
from dapo_ablate.sweeps.knobs import KNOB_DIGITS, knob_text  # noqa: E402
from dapo_ablate.sweeps.report_data import RELIABLE_IMPORTANCE_TRIALS, shown_unit  # noqa: E402
from dapo_ablate.sweeps.trials import CI_LEVEL  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from dapo_ablate.sweeps.report_data import SweepReport

WARNING_COLOUR = "#a4161a"


def render_figures(report: SweepReport) -> dict[str, bytes]:
    """The report's figures as PNG bytes by file name, in page order; those with nothing to draw left out."""
    builders: dict[str, Callable[[SweepReport], Figure | None]] = {
        "history.png": history_figure, "knobs.png": knob_figure, "importances.png": importance_figure,
        "effects.png": effects_figure,
    }
    pngs = {}
    with matplotlib.rc_context({"text.parse_math": False}):
        for name, build in builders.items():
            figure = build(report)
            if figure is not None:
                pngs[name] = figure_png(figure)
    return pngs


def _scale(report: SweepReport) -> float:
    return 100.0 if report.percent else 1.0


def history_figure(report: SweepReport) -> Figure | None:
    """Each trial's value (pruned: its last intermediate value) and the best so far, by trial number."""
    trials = report.trials
    shown = trials[trials["state"].isin(["COMPLETE", "PRUNED"]) & trials[report.metric].notna()]
    if shown.empty:
        return None
    scale = _scale(report)
    figure, axis = plt.subplots(figsize=(6.5, 3.6))
    for state, marker, label in (("COMPLETE", "o", "complete"), ("PRUNED", "x", "pruned (last reported)")):
        sub = shown[shown["state"] == state]
        if not sub.empty:
            axis.scatter(sub["trial"], sub[report.metric].astype(float) * scale, marker=marker, label=label)
    complete = shown[shown["state"] == "COMPLETE"].sort_values("trial")
    if not complete.empty:
        values = complete[report.metric].to_numpy(dtype=float) * scale
        best = np.maximum.accumulate(values) if report.direction == "maximize" else np.minimum.accumulate(values)
        axis.step(complete["trial"], best, where="post", color="black", linewidth=1, label="best so far")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("trial number")
    axis.set_ylabel(f"{report.metric}{shown_unit(report)}")
    axis.set_title(f"{report.name}: {report.metric} by trial")
    axis.legend(fontsize=8)
    return figure


def knob_figure(report: SweepReport) -> Figure | None:
    """The objective against each knob (one panel each): complete trials, pruned ones at their last
    reported value, the best trial starred."""
    trials = report.trials
    shown = trials[trials["state"].isin(["COMPLETE", "PRUNED"]) & trials[report.metric].notna()]
    if shown.empty or not report.knobs:
        return None
    scale, knobs = _scale(report), report.knobs
    figure, axes = plt.subplots(1, len(knobs), figsize=(3.2 * len(knobs) + 0.6, 3.4), squeeze=False, sharey=True)
    best = report.best_params["trial"].iloc[0] if len(report.best_params) else None
    for axis, knob in zip(axes[0], knobs):
        x = _knob_axis(axis, report, knob, trials[knob])
        for state, marker, label in (("COMPLETE", "o", "complete"), ("PRUNED", "x", "pruned")):
            mask = (trials.index.isin(shown.index) & (trials["state"] == state)).to_numpy()
            if mask.any():
                axis.scatter(x[mask], trials.loc[mask, report.metric].astype(float) * scale, marker=marker, label=label,
                             color="C0" if state == "COMPLETE" else "C1")
        if best is not None:
            row = (trials["trial"] == best).to_numpy()
            axis.scatter(x[row], trials.loc[row, report.metric].astype(float) * scale, marker="*", s=160,
                         color="C3", zorder=3, label="best")
    axes[0][0].set_ylabel(f"{report.metric}{shown_unit(report)}")
    axes[0][-1].legend(fontsize=8)
    figure.suptitle(f"{report.name}: {report.metric} against each knob", fontsize=10)
    return figure


def importance_figure(report: SweepReport) -> Figure | None:
    """fANOVA importance of each knob in % of variance, one bar group per target (objective, each
    effect); a red warning above the bars when they rest on too few trials."""
    table = report.importances
    if table.empty:
        return None
    targets = list(dict.fromkeys(table["target"]))
    knobs = list(dict.fromkeys(table["knob"]))
    y = np.arange(len(knobs))
    height = 0.8 / len(targets)
    warning = report.importance_warning
    figure, axis = plt.subplots(figsize=(6.5, 0.5 * len(knobs) * len(targets) + 1.6 + (0.6 if warning else 0)))
    for i, target in enumerate(targets):
        sub = table[table["target"] == target].set_index("knob").reindex(knobs)
        axis.barh(y + i * height, 100 * sub["importance"].fillna(0), height=height, label=target)
    axis.set_yticks(y + height * (len(targets) - 1) / 2, knobs)
    axis.invert_yaxis()
    axis.set_xlim(0, 100)
    axis.set_xlabel("importance (% of variance explained, fANOVA; sums to 100 per target)")
    axis.legend(fontsize=8)
    if warning:  # as the axes' title, so that tight_layout keeps room for it
        n = report.complete_trials
        text = (f"Warning: only {n} complete trial{'s' * (n != 1)} (fewer than {RELIABLE_IMPORTANCE_TRIALS}); fANOVA "
                "importances are unstable at this size: a hint, not a ranking")
        axis.set_title(textwrap.fill(text, 64), color=WARNING_COLOUR, fontsize=9, loc="left", fontweight="bold")
    return figure


def effects_figure(report: SweepReport) -> Figure | None:
    """Each factor's effect (rows) against each knob (columns), in pp; an error bar only where a
    setting's seeds give a t interval."""
    effects = report.effects
    if effects is None or effects.empty:
        return None
    factors, knobs = report.factors, report.knobs
    figure, axes = plt.subplots(len(factors), len(knobs), figsize=(3.4 * len(knobs) + 0.6, 2.8 * len(factors) + 0.6),
                                squeeze=False)
    any_interval = pd.to_numeric(effects["ci_low"], errors="coerce").notna().any()
    for row, factor in enumerate(factors):
        sub = effects[effects["factor"] == factor]
        for col, knob in enumerate(knobs):
            axis = axes[row][col]
            _effect_points(axis, report, sub, _knob_axis(axis, report, knob, sub[knob]))
            if col == 0:
                axis.set_ylabel(f"effect of {factor}\non {report.metric}{shown_unit(report)}")
    figure.suptitle(f"{report.name}: each factor's effect across knob settings\n({_interval_words(effects, any_interval)})",
                    fontsize=10)
    return figure


def _interval_words(effects: pd.DataFrame, any_interval: bool) -> str:
    seeds = pd.to_numeric(effects["seeds"], errors="coerce")
    if not any_interval:
        return "one seed per setting: points only, no interval"
    if (seeds >= 2).all():
        return f"{CI_LEVEL:.0%} t interval over seeds"
    return f"{CI_LEVEL:.0%} t interval over seeds where a setting has two or more"


def _effect_points(axis: Axes, report: SweepReport, sub: pd.DataFrame, x: np.ndarray) -> None:
    scale = _scale(report)
    center = sub["effect"].to_numpy(dtype=float) * scale
    low = pd.to_numeric(sub["ci_low"], errors="coerce").to_numpy(dtype=float) * scale
    high = pd.to_numeric(sub["ci_high"], errors="coerce").to_numpy(dtype=float) * scale
    has = ~(np.isnan(low) | np.isnan(high))
    if has.any():
        axis.errorbar(x[has], center[has], yerr=np.vstack([center[has] - low[has], high[has] - center[has]]),
                      fmt="o", capsize=3, markersize=4, color="C0")
    if (~has).any():
        axis.plot(x[~has], center[~has], "o", markersize=4, color="C0")
    axis.axhline(0, color="black", linewidth=0.8)


def _knob_axis(axis: Axes, report: SweepReport, knob: str, values: pd.Series) -> np.ndarray:
    """Set up `axis`'s x axis for `knob` and return the x positions of `values`: numbers as they
    are (log scale for a log knob), a categorical knob as positions of its choices in order."""
    axis.set_xlabel(knob)
    numeric = pd.to_numeric(values, errors="coerce")
    is_number = numeric.notna() | values.isna()
    categorical = knob in report.categorical_knobs or values.map(lambda v: isinstance(v, bool)).any()
    if is_number.all() and numeric.notna().any() and not categorical:
        tick_text = FuncFormatter(lambda v, _: knob_text(float(v), KNOB_DIGITS[1]))
        if knob in report.log_knobs and (numeric.dropna() > 0).all():
            low, high = numeric.min() / LOG_PAD, numeric.max() * LOG_PAD
            axis.set_xscale("log")
            axis.set_xlim(low, high)
            axis.xaxis.set_major_locator(FixedLocator(_log_ticks(low, high)))
            axis.xaxis.set_minor_formatter(NullFormatter())
        elif (numeric.dropna() % 1 == 0).all():
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.xaxis.set_major_formatter(tick_text)
        return numeric.to_numpy(dtype=float)
    labels = _choices_in_order(values.dropna())
    axis.set_xticks(range(len(labels)), [knob_text(v) for v in labels])
    axis.set_xlim(-0.5, len(labels) - 0.5)
    index = {repr(v): i for i, v in enumerate(labels)}
    return np.array([index.get(repr(v), np.nan) for v in values], dtype=float)


LOG_PAD = 1.15
"""A log axis reaches this factor beyond the smallest and largest value."""


def _log_ticks(low: float, high: float) -> list[float]:
    """Round ticks between `low` and `high` on a log axis: powers of ten, else 1-2-5, 1-2-3-5 or
    every digit times a power of ten, the sparsest that gives three; at most six (every other one)."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    ticks: list[float] = []
    for mantissas in ((1,), (1, 2, 5), (1, 2, 3, 5), tuple(range(1, 10))):
        ticks = [m * 10.0**e for e in decades for m in mantissas if low <= m * 10.0**e <= high]
        if len(ticks) >= 3:
            break
    while len(ticks) > 6:
        ticks = ticks[::2]
    return ticks


def _choices_in_order(values: pd.Series) -> list:
    """A categorical knob's values seen, numbers in numeric order (4, 8, 12), then the rest by text."""
    distinct = list({repr(v): v for v in values}.values())
    numbers = sorted((v for v in distinct if isinstance(v, (int, float)) and not isinstance(v, bool)), key=float)
    return numbers + sorted((v for v in distinct if v not in numbers), key=str)
