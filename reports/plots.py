"""PNG figures (matplotlib, Agg backend: no display needed). Each returns PNG bytes or None.

Values are drawn in percentage points when the metric is a fraction, like the tables. Names
are user text, so every figure draws "$" as it is, never as TeX math (``literal_text``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from .table import cell_label, cell_masks, factor_label  # noqa: E402


def literal_text(plot):
    """Run ``plot`` with matplotlib's math parsing off: a factor named ``$\\foo$`` is drawn as
    written instead of failing the whole report with a mathtext error."""

    @functools.wraps(plot)
    def draw(*args, **kwargs):
        with matplotlib.rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return draw


class FigureBytes(bytes):
    """A figure's PNG bytes, with the same figure in the vector formats asked for (`vectors`:
    format -> bytes), rendered from the same matplotlib figure."""

    vectors: dict[str, bytes]


_VECTOR_FORMATS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("vector_formats", default=())


@contextlib.contextmanager
def vector_formats(formats: tuple[str, ...]):
    """Within the block, every figure is also rendered as each of `formats` (pdf, svg)."""
    token = _VECTOR_FORMATS.set(tuple(formats))
    try:
        yield
    finally:
        _VECTOR_FORMATS.reset(token)


def figure_png(figure, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> bytes:
    """Render a matplotlib figure to PNG bytes (and the `vector_formats` asked for) and close it;
    ``rect``: the part of the figure the axes may fill (room left for a figure-level legend)."""
    figure.tight_layout(rect=rect)
    rendered = {}
    for fmt in ("png", *_VECTOR_FORMATS.get()):
        buffer = io.BytesIO()
        figure.savefig(buffer, format=fmt, dpi=110, **({"metadata": {"Date": None}} if fmt == "pdf" else {}))
        rendered[fmt] = buffer.getvalue()
    plt.close(figure)
    out = FigureBytes(rendered.pop("png"))
    out.vectors = rendered
    return out


def metric_scale(percent: bool) -> tuple[float, str]:
    return (100.0, " (pp)") if percent else (1.0, "")


def _error_bars(center: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray | None:
    if np.isnan(low).all():
        return None
    return np.nan_to_num(np.vstack([center - low, high - center]))


@literal_text
def shapley_plot(shapley: pd.DataFrame, metric: str, percent: bool, confidence: float) -> bytes | None:
    """Bars of Shapley and Banzhaf values per factor, with their confidence intervals."""
    if shapley["shapley"].isna().all():
        return None
    scale, unit = metric_scale(percent)
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


@literal_text
def position_plot(orderings: pd.DataFrame, metric: str, percent: bool) -> bytes | None:
    """Mean gain of each factor by the position at which an ordering adds it, with CIs."""
    by_position = orderings[orderings["position"] != "all"]
    if by_position.empty:
        return None
    scale, unit = metric_scale(percent)
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


PAPER_COLOUR = "#9a9a9a"
CURVES_PER_ROW = 4
"""Panels per row of the learning-curves grid (readable when a page scales the figure down)."""
OFF_COLOUR, ON_COLOUR = "#4c72b0", "#dd8452"  # technique off / on, in every figure


def _fitted_limits(values: np.ndarray, share: float = 0.08) -> tuple[float, float] | None:
    """y limits that fit ``values`` (means and interval ends) with a margin of ``share`` of their
    range on each side; None when none is finite."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return None
    low, high = float(finite.min()), float(finite.max())
    pad = share * (high - low) if high > low else max(abs(high) * 0.05, 0.5)
    return low - pad, high + pad


def cumulative_limits(cumulative: pd.DataFrame, scale: float) -> tuple[float, float] | None:
    """The shared y axis of the cumulative figure: it fits every mean and interval shown (it does
    not start at 0, so a few points' differences are not flattened), with room for the labels."""
    values = cumulative[["mean", "ci_low", "ci_high"]].to_numpy(float).ravel() * scale
    return _fitted_limits(values)


def _cumulative_panel(axis, rows: pd.DataFrame, scale: float, percent: bool, paper_label: str) -> None:
    """One ordering's path: the mean of each step with its CI, joined by a line, each value written
    to the right of its point (clear of the interval's caps); the paper's numbers, where shown, on
    their own right-hand axis (another model and budget: compare the shape, not the level)."""
    x = np.arange(len(rows))
    mean = rows["mean"].to_numpy(float) * scale
    low, high = rows["ci_low"].to_numpy(float) * scale, rows["ci_high"].to_numpy(float) * scale
    observed = rows["observed"].to_numpy(bool) if "observed" in rows else np.ones(len(rows), dtype=bool)
    axis.errorbar(x, mean, yerr=_error_bars(mean, low, high), fmt="-", color=ON_COLOUR, capsize=4, linewidth=1.2)
    axis.plot(x[observed], mean[observed], "o", color=ON_COLOUR, markersize=5, label="observed (cell run)")
    if not observed.all():  # a fraction's unrun cells: the fitted model's prediction, drawn hollow
        axis.plot(x[~observed], mean[~observed], "o", markerfacecolor="white", markeredgecolor=ON_COLOUR, markersize=6,
                  label="predicted (cell not run)")  # fmt: skip
    for xi, value in zip(x, mean):
        if np.isnan(value):  # a cell the design lacks (an incomplete design or a fraction)
            axis.annotate("no cell", (xi, 0.02), xycoords=("data", "axes fraction"), ha="center", fontsize=7,
                          color="#777777", rotation=90, va="bottom")  # fmt: skip
            continue
        axis.annotate(f"{value:.1f}" if percent else f"{value:.3g}", (xi, value), xytext=(7, 0),
                      textcoords="offset points", ha="left", va="center", fontsize=7, zorder=5,
                      bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})  # fmt: skip
    handles = axis.get_legend_handles_labels()[0] if not observed.all() else []
    if "paper" in rows and rows["paper"].notna().any():
        twin = axis.twinx()
        twin.plot(x, rows["paper"].to_numpy(float), "D--", color=PAPER_COLOUR, markersize=4, linewidth=1,
                  label=paper_label)  # fmt: skip
        twin.set_ylabel("paper (pp)" if percent else "paper", fontsize=7, color=PAPER_COLOUR)
        twin.tick_params(labelsize=7, colors=PAPER_COLOUR)
        handles = axis.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    if handles:
        axis.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    axis.set_xlim(-0.5, len(rows) - 0.3)  # room for the last value's label


@literal_text
def cumulative_plot(
    cumulative: pd.DataFrame, metric: str, percent: bool, confidence: float, baseline_label: str, paper_label: str
) -> bytes | None:
    """The cumulative path of each ordering (mean with CI per step, labelled ``+OF`` ...) on one
    y axis fitted to the data, and beside the ``paper`` ordering the paper's own numbers (column
    ``paper``) on a second axis.

    ``cumulative``: the report's cumulative table (already cut to the orderings it shows).
    """
    if cumulative.empty or cumulative["mean"].isna().all():
        return None
    scale, unit = metric_scale(percent)
    orderings = list(dict.fromkeys(cumulative["ordering"]))
    steps = cumulative.groupby("ordering", sort=False).size().max()
    figure, axes = plt.subplots(
        1, len(orderings), figsize=(1.05 * steps * len(orderings) + 2.2, 4.1), sharey=True, squeeze=False
    )
    limits = cumulative_limits(cumulative, scale)
    for axis, name in zip(axes[0], orderings):
        rows = cumulative[cumulative["ordering"] == name]
        _cumulative_panel(axis, rows, scale, percent, paper_label)
        labels = [baseline_label if row.step == 0 else f"+{factor_label(row.added)}" for row in rows.itertuples(index=False)]
        axis.set_xticks(np.arange(len(rows)), labels, fontsize=8)
        axis.set_title(f"ordering {name}", fontsize=9)
        axis.grid(axis="y", linewidth=0.4, alpha=0.5)
        if limits is not None:
            axis.set_ylim(*limits)
    axes[0][0].set_ylabel(f"{metric}{unit}")
    figure.suptitle(f"Cumulative path: each point adds one factor to the one before ({confidence:.0%} CIs)", fontsize=10)
    return figure_png(figure)


def _forest_rows(axis, rows: pd.DataFrame, scale: float, colour: str, tested: set[str], supported: set[str]) -> None:
    """One horizontal CI line and point per row (``term``, ``label``, ``estimate``, ``ci_low``,
    ``ci_high``): filled points are claims, hollow ones were tested and are not supported, small
    diamonds are in no claims family of this design (e.g. main effects beside Shapley values)."""
    y = np.arange(len(rows))
    center = rows["estimate"].to_numpy(float) * scale
    bars = _error_bars(center, rows["ci_low"].to_numpy(float) * scale, rows["ci_high"].to_numpy(float) * scale)
    axis.errorbar(center, y, xerr=bars, fmt="none", ecolor=colour, capsize=3, linewidth=1.2)
    claimed = rows["term"].isin(supported).to_numpy()
    quiet = rows["term"].isin(tested).to_numpy() & ~claimed
    untested = ~claimed & ~quiet
    axis.scatter(center[claimed], y[claimed], color=colour, zorder=3, s=30, label="supported (adjusted test)")
    axis.scatter(center[quiet], y[quiet], facecolor="white", edgecolor=colour, zorder=3, s=30, label="not supported")
    axis.scatter(center[untested], y[untested], color=colour, marker="D", zorder=3, s=12, label="not a claims family here")
    axis.set_yticks(y, rows["label"], fontsize=8)
    axis.set_ylim(len(rows) - 0.5, -0.5)
    axis.axvline(0, color="black", linewidth=0.8)


@literal_text
def effects_forest_plot(
    shapley: pd.DataFrame, effects: pd.DataFrame, tests: pd.DataFrame, metric: str, percent: bool, confidence: float
) -> bytes | None:
    """Forest plot: Shapley values (top) and factorial effects, main and two-factor (bottom),
    each with its CI; ``tests`` (the analysis's tested statistics, ``claimed`` marking the
    claims of claims.csv) says how each point is drawn (see ``_forest_rows``)."""
    scale, unit = metric_scale(percent)
    panels = []
    if not shapley["shapley"].isna().all():
        rows = shapley.rename(columns={"shapley": "estimate"}).assign(term=shapley["factor"])
        panels.append(("Shapley values (mean gain over all orderings)", rows, {"shapley"}, "#4c72b0"))
    if len(effects) and not effects["effect"].isna().all():
        rows = effects.rename(columns={"effect": "estimate"})
        panels.append(("Factorial effects: main effects, then two-factor interactions", rows, {"main", "interaction"}, "#55a868"))
    if not panels:
        return None
    heights = [len(rows) for _, rows, _, _ in panels]
    figure, axes = plt.subplots(
        len(panels), 1, figsize=(7.0, 0.28 * sum(heights) + 1.2 * len(panels) + 0.8), squeeze=False,
        gridspec_kw={"height_ratios": heights}, sharex=True,
    )  # fmt: skip
    for axis, (title, rows, kinds, colour) in zip(axes[:, 0], panels):
        family = tests[tests["kind"].isin(kinds)] if len(tests) else tests
        tested = set(family["term"]) if len(family) else set()
        supported = set(family.loc[family["claimed"].astype(bool), "term"]) if len(family) else set()
        rows = rows.assign(label=[_term_label(t) for t in rows["term"]]).reset_index(drop=True)
        _forest_rows(axis, rows, scale, colour, tested, supported)
        mains = int((~rows["term"].str.contains(":")).sum())
        if 0 < mains < len(rows):  # a rule between the main effects and the interactions
            axis.axhline(mains - 0.5, color="#bbbbbb", linewidth=0.8)
        axis.set_title(title, fontsize=9)
    handles = {}
    for axis in axes[:, 0]:
        for handle, label in zip(*axis.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    figure.legend(handles.values(), handles.keys(), loc="lower center", ncol=3, fontsize=7, frameon=False)
    axes[-1, 0].set_xlabel(f"effect on {metric}{unit}, {confidence:.0%} CI")
    return figure_png(figure, rect=(0, 0.04, 1, 1))


def _term_label(term: str) -> str:
    """``overlong_filter:clip_higher = a:b`` -> ``OF x CH = a x b``."""
    return " = ".join(" x ".join(factor_label(f) for f in member.split(":")) for member in term.split(" = "))


@literal_text
def interaction_plots(means: pd.DataFrame, metric: str, percent: bool, confidence: float) -> bytes | None:
    """Classic 2x2 interaction plots, one panel per two-factor interaction: the mean of
    ``metric`` with the first factor off/on (x) for the second factor off and on (two lines),
    averaged over the other factors' levels, with CIs. Parallel lines: no interaction.

    ``means``: one row per (pair, a_level, b_level) with columns ``a``, ``b``, ``a_level``,
    ``b_level``, ``mean``, ``ci_low``, ``ci_high``, and per pair ``effect``, ``effect_ci_low``,
    ``effect_ci_high``, ``supported`` (the interaction is a claim).
    """
    if means.empty:
        return None
    return figure_png(interaction_figure(means, metric, percent, confidence))


def interaction_figure(means: pd.DataFrame, metric: str, percent: bool, confidence: float) -> Any:
    """The figure of `interaction_plots`; each panel's legend (the second factor off / on) sits
    below its axes, never over the data."""
    scale, unit = metric_scale(percent)
    pairs = list(dict.fromkeys(zip(means["a"], means["b"])))
    columns = min(len(pairs), 5)
    rows_n = -(-len(pairs) // columns)
    figure, axes = plt.subplots(
        rows_n, columns, figsize=(2.3 * columns + 0.6, 2.9 * rows_n + 0.6), sharey=True, squeeze=False
    )
    for axis in axes.ravel()[len(pairs):]:
        axis.set_visible(False)
    for axis, (a, b) in zip(axes.ravel(), pairs):
        part = means[(means["a"] == a) & (means["b"] == b)]
        for level, colour, style in ((0, OFF_COLOUR, "--"), (1, ON_COLOUR, "-")):
            line = part[part["b_level"] == level].sort_values("a_level")
            mean = line["mean"].to_numpy(float) * scale
            bars = _error_bars(mean, line["ci_low"].to_numpy(float) * scale, line["ci_high"].to_numpy(float) * scale)
            axis.errorbar(
                line["a_level"] + (level - 0.5) * 0.04, mean, yerr=bars, color=colour, linestyle=style, marker="o",
                capsize=3, markersize=4, label=f"{factor_label(b)} {'on' if level else 'off'}",
            )  # fmt: skip
        head = part.iloc[0]
        effect = f"{head.effect * scale:+.1f}" if percent else f"{head.effect:+.3g}"
        ci = (
            f"[{head.effect_ci_low * scale:.1f}, {head.effect_ci_high * scale:.1f}]"
            if percent
            else f"[{head.effect_ci_low:.3g}, {head.effect_ci_high:.3g}]"
        )
        axis.set_title(
            f"{factor_label(a)} x {factor_label(b)}: interaction {effect} {ci}" + ("\nsupported" if head.supported else ""),
            fontsize=8, fontweight="bold" if head.supported else "normal",
        )  # fmt: skip
        axis.set_xticks([0, 1], [f"{factor_label(a)} off", f"{factor_label(a)} on"], fontsize=8)
        axis.set_xlim(-0.3, 1.3)
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False,
                    handlelength=1.6, columnspacing=0.8)
    for axis in axes[:, 0]:
        axis.set_ylabel(f"{metric}{unit}", fontsize=8)
    figure.suptitle(f"Two-factor interactions: means over the other factors, {confidence:.0%} CIs", fontsize=10)
    return figure


SIGNAL_LABELS = {
    "reward": "critic/score/mean",
    "entropy": "actor/entropy",
    "response_length": "response_length/mean",
    "truncation_rate": "response_length/clip_ratio",
    "pg_clipfrac": "actor/pg_clipfrac",
    "approx_kl": "actor/ppo_kl",
    "groups_mixed": "train/groups_mixed",
    "gen_rounds": "train/num_gen_batches",
}
"""Training signals the signals figure draws (ledger key -> verl's name, the MLflow name; kept in
step with ``dapo_ablate.ablation.store.metric_names``, which the reports may not import).
``pg_clipfrac`` is ``clipfrac_low + clipfrac_high``, as verl counts it."""


def signal_columns(signals: pd.DataFrame) -> list[str]:
    """The signals of SIGNAL_LABELS that the table has and that vary at all."""
    return [name for name in SIGNAL_LABELS if name in signals and signals[name].nunique(dropna=True) > 1]


def signal_owner(signals: pd.DataFrame, name: str, factors: list[str]) -> str | None:
    """The factor without which the signal does not move, or None: with it off the signal takes one
    value in every run (``train/num_gen_batches`` is 1 without dynamic sampling) or is not logged at
    all (verl logs it only with dynamic sampling on), with it on it takes another (the built-in
    trainer's DS runs may take 2 rounds at every step: constant, but not 1). In the other factors'
    panels such a signal is compared over the runs with its owner on: averaging in the runs where
    it cannot move would draw a flat line at a mixture level with a band that is only the owner's
    effect."""
    for factor in factors:
        off, on = signals.loc[signals[factor] == 0, name].dropna(), signals.loc[signals[factor] == 1, name].dropna()
        if len(on) and off.nunique() <= 1 and not on.isin(off.unique()).all():
            return factor
    return None


def _band(values: pd.Series) -> tuple[float, float, float]:
    """Mean and 95% t interval of the mean over runs (the interval is NaN for one run)."""
    n, mean = values.count(), values.mean()
    if n < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.975, n - 1) * values.std(ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half


@literal_text
def signals_plot(signals: pd.DataFrame, factors: list[str]) -> bytes | None:
    """Training signals by technique: one row of panels per signal, one column per factor; each
    panel the per-step mean over the runs with the factor off and on, with a band.

    ``signals``: one row per (run, step) with the factor columns, ``run_id`` and the signals
    (``signals_table`` adds ``pg_clipfrac``). The band is the 95% t interval of the mean over
    the runs at that level; the runs differ in the other factors, so it includes their effects.
    """
    names = signal_columns(signals)
    if not names:
        return None
    figure, axes = plt.subplots(
        len(names), len(factors), figsize=(2.5 * len(factors) + 0.8, 1.9 * len(names) + 0.8),
        sharex=True, sharey="row", squeeze=False,
    )  # fmt: skip
    for i, name in enumerate(names):
        owner = signal_owner(signals, name, factors)
        for j, factor in enumerate(factors):
            axis = axes[i, j]
            runs = signals if owner in (None, factor) else signals[signals[owner] == 1]
            if owner not in (None, factor):
                axis.text(0.98, 0.96, f"runs with {factor_label(owner)} on", transform=axis.transAxes, ha="right",
                          va="top", fontsize=6, color="#555555")  # fmt: skip
            for level, colour in ((0, OFF_COLOUR), (1, ON_COLOUR)):
                rows = runs[runs[factor] == level]
                summary = rows.groupby("step")[name].apply(lambda v: pd.Series(_band(v), index=["mean", "low", "high"]))
                summary = summary.unstack()
                axis.plot(summary.index, summary["mean"], color=colour, linewidth=1.2, label="on" if level else "off")
                axis.fill_between(summary.index, summary["low"], summary["high"], color=colour, alpha=0.2, linewidth=0)
            if i == 0:
                axis.set_title(factor_label(factor), fontsize=9)
            if j == 0:
                axis.set_ylabel(SIGNAL_LABELS[name], fontsize=7)
            axis.tick_params(labelsize=7)
    for axis in axes[-1]:
        axis.set_xlabel("training step", fontsize=8)
    axes[0, -1].legend(fontsize=7, title="factor", title_fontsize=7)
    figure.suptitle("Training signals by technique\n(mean over runs with the factor off / on, 95% band)", fontsize=10)
    return figure_png(figure, rect=(0, 0, 1, 0.97))


@literal_text
def curves_plot(curves: pd.DataFrame, factors: list[str], metric: str, percent: bool) -> bytes | None:
    """Learning curves as small multiples, one panel per cell labelled by it (cells ordered by how
    many factors are on): each seed thin, their mean thick, and the baseline cell's mean dashed
    grey in every panel for reference.

    ``curves``: one row per (cell, seed, step) with the factor columns, ``seed``, ``step`` and
    the metric, already checked by ``table.validate_curves``.
    """
    scale, unit = metric_scale(percent)
    table = curves.assign(_mask=cell_masks(curves, factors))
    masks = sorted(table["_mask"].unique(), key=lambda m: (bin(int(m)).count("1"), int(m)))
    mean = table.groupby(["_mask", "step"])[metric].mean()
    baseline = mean.loc[0] if 0 in mean.index.get_level_values(0) else None
    columns = min(len(masks), CURVES_PER_ROW)
    rows_n = -(-len(masks) // columns)
    figure, axes = plt.subplots(
        rows_n, columns, figsize=(2.6 * columns + 0.8, 2.0 * rows_n + 1.0), sharex=True, sharey=True, squeeze=False
    )
    for axis in axes.ravel()[len(masks):]:
        axis.set_visible(False)
    for axis, mask in zip(axes.ravel(), masks):
        for _, run in table[table["_mask"] == mask].groupby("seed"):
            axis.plot(run["step"], run[metric] * scale, color=ON_COLOUR, linewidth=0.6, alpha=0.45)
        if baseline is not None and mask != 0:
            axis.plot(baseline.index, baseline.to_numpy() * scale, color="#777777", linestyle="--", linewidth=0.9)
        cell = mean.loc[mask]
        axis.plot(cell.index, cell.to_numpy() * scale, color="#c44e52", linewidth=1.6)
        axis.set_title(f"{cell_label(int(mask), factors)}: {cell.iloc[-1] * scale:.1f}" if percent
                       else f"{cell_label(int(mask), factors)}: {cell.iloc[-1]:.3g}", fontsize=7)  # fmt: skip
        axis.tick_params(labelsize=7)
    for row, column in np.ndindex(axes.shape):
        below = axes[row + 1, column] if row + 1 < axes.shape[0] else None
        if axes[row, column].get_visible() and (below is None or not below.get_visible()):
            axes[row, column].set_xlabel("step", fontsize=7)  # the lowest panel of each column (a short last row)
            axes[row, column].tick_params(labelbottom=True)
    for axis in axes[:, 0]:
        axis.set_ylabel(f"{metric}{unit}", fontsize=7)
    figure.suptitle(
        "Learning curves per cell (thin: seeds; thick: their mean; dashed: the baseline cell's mean)", fontsize=9
    )
    return figure_png(figure)


def cell_line_style(i: int, mask: int, k: int, cells: int) -> dict:
    """How the i-th of ``cells`` cells is drawn when all share one axis: the baseline black dashed,
    the full cell thick, the others by colour (and line style once the colours run out)."""
    if mask == 0:
        return {"color": "black", "linestyle": "--", "linewidth": 1.4}
    colours = plt.get_cmap("tab20" if cells > 10 else "tab10")
    return {"color": colours(i % colours.N), "linestyle": ("-", "--", ":", "-.")[(i // colours.N) % 4],
            "linewidth": 2.2 if mask == 2**k - 1 else 1.1}  # fmt: skip


@literal_text
def signals_by_cell_plot(signals: pd.DataFrame, factors: list[str]) -> bytes | None:
    """Per-cell signal curves: one panel per training signal that varies (at most 4 per row), each
    cell's per-step mean over its seeds as one line (styled as in the learning-curves overlay), one
    legend of the cells for all panels."""
    names = signal_columns(signals)
    if not names:
        return None
    table = signals.assign(_mask=cell_masks(signals, factors))
    masks = sorted(table["_mask"].unique(), key=lambda m: (bin(int(m)).count("1"), int(m)))
    columns = min(len(names), CURVES_PER_ROW)
    rows_n = -(-len(names) // columns)
    figure, axes = plt.subplots(rows_n, columns, figsize=(3.3 * columns + 2.6, 2.5 * rows_n + 0.8), squeeze=False)
    for axis in axes.ravel()[len(names):]:
        axis.set_visible(False)
    means = {name: table.groupby(["_mask", "step"])[name].mean() for name in names}
    for axis, name in zip(axes.ravel(), names):
        for i, mask in enumerate(masks):
            cell = means[name].loc[mask]
            axis.plot(cell.index, cell.to_numpy(), label=cell_label(int(mask), factors),
                      **cell_line_style(i, int(mask), len(factors), len(masks)))  # fmt: skip
        axis.set_title(SIGNAL_LABELS[name], fontsize=8)
        axis.set_xlabel("training step", fontsize=7)
        axis.tick_params(labelsize=7)
        axis.grid(linewidth=0.4, alpha=0.5)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0 - 2.4 / figure.get_figwidth(), 0.95),
                  ncol=1 if len(masks) <= 16 else 2, title="cell", title_fontsize=7, frameon=False)  # fmt: skip
    figure.suptitle("Training signals per cell (mean over its seeds)", fontsize=10)
    return figure_png(figure, rect=(0, 0, 1 - 2.5 / figure.get_figwidth(), 0.96))


@literal_text
def curves_overlay_plot(curves: pd.DataFrame, factors: list[str], metric: str, percent: bool) -> bytes | None:
    """Every cell's mean learning curve on one axis (colour and line style by cell, the baseline
    black dashed, the full cell thick), with a legend of the cells and their final means, highest
    first: which cells separate, and when."""
    scale, unit = metric_scale(percent)
    table = curves.assign(_mask=cell_masks(curves, factors))
    mean = table.groupby(["_mask", "step"])[metric].mean().mul(scale)
    finals = mean.groupby(level=0).last().sort_values(ascending=False)
    figure, axis = plt.subplots(figsize=(8.5, 4.8))
    for i, (mask, final) in enumerate(finals.items()):
        cell = mean.loc[mask]
        label = f"{cell_label(int(mask), factors)}: {final:.1f}" if percent else f"{cell_label(int(mask), factors)}: {final:.3g}"
        axis.plot(cell.index, cell.to_numpy(), label=label, **cell_line_style(i, int(mask), len(factors), len(finals)))
    axis.set_xlabel("step")
    axis.set_ylabel(f"{metric}{unit}")
    axis.grid(linewidth=0.4, alpha=0.5)
    axis.legend(fontsize=7, ncol=1 if len(finals) <= 16 else 2, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                title="cell: final mean", title_fontsize=7, frameon=False)  # fmt: skip
    axis.set_title("Learning curves of all cells (mean over seeds), legend by final mean", fontsize=9)
    return figure_png(figure)


@literal_text
def forest_plot(transfer: pd.DataFrame, statistic: str, metric: str, percent: bool, confidence: float) -> bytes | None:
    """Forest plot: each term's estimate with its CI in every setting (one row per term, one
    marker per setting, offset vertically), and the verdict beside the term."""
    rows = transfer[transfer["statistic"] == statistic]
    if rows.empty or rows["estimate"].isna().all():
        return None
    scale, unit = metric_scale(percent)
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
