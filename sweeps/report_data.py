"""A sweep report's tables (what `sweeps.report.build_report` computes and `sweeps.plots` draws),
and how their values read on a page or a figure.

Machine-readable CSVs keep what the study stored: metric values as fractions, knob values at
full precision. Where a person reads (report.md, sweep_report.html, the figures), metric values
are percentage points when the metric is a fraction (like the experiment report: every value of
the objective lies in [0, 1]), with the unit in every header and axis label, and knob values are
rounded to the significant digits that keep a knob's values apart (``sweeps.knobs``, as the
sweep's console lines show them). units.csv says how each CSV column is stored (``units_like``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dapo_ablate.sweeps.knobs import is_missing, knob_digits, knob_text
from dapo_ablate.sweeps.trials import CI_LEVEL

RELIABLE_IMPORTANCE_TRIALS = 20
"""fANOVA fits a random forest to the trials; below this many complete trials its importances
move a lot from one study to the next, so the report warns that they are a hint, not a ranking."""


@dataclass
class SweepReport:
    name: str
    metric: str
    direction: str
    knobs: list[str]
    factors: list[str]
    best_params: pd.DataFrame
    trials: pd.DataFrame
    importances: pd.DataFrame
    importance_note: str = ""
    effects: pd.DataFrame | None = None
    effect_summary: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
    log_knobs: frozenset[str] = frozenset()
    """Knobs sampled on a log scale (the spec's ``log: true`` or the trials' Optuna distribution)."""
    categorical_knobs: frozenset[str] = frozenset()
    """Knobs whose values are choices (drawn as categories in their order, not on a number line)."""

    @property
    def percent(self) -> bool:
        """Whether the metric is a fraction (every value of the objective in [0, 1]): then a person
        reads it, and every effect on it, in percentage points."""
        return bool(pd.to_numeric(self.trials[self.metric], errors="coerce").dropna().between(0, 1).all())

    @property
    def complete_trials(self) -> int:
        return int((self.trials["state"] == "COMPLETE").sum())

    @property
    def importance_warning(self) -> str:
        """A warning when importances were computed from fewer than `RELIABLE_IMPORTANCE_TRIALS`
        complete trials; empty otherwise."""
        n = self.complete_trials
        if self.importances.empty or n >= RELIABLE_IMPORTANCE_TRIALS:
            return ""
        return (f"Warning: these importances rest on {n} complete trial{'s' * (n != 1)}, fewer than "
                f"{RELIABLE_IMPORTANCE_TRIALS}; fANOVA's forest is unstable at this size, so read them as a hint, "
                "not a ranking, and run more trials before citing them")


# ----------------------------------------------------------------------------- how values read
def shown_unit(report: SweepReport) -> str:
    """The unit a person reads the metric in, as it follows a header or an axis label."""
    return " (pp)" if report.percent else ""


def units_like(report: SweepReport) -> dict[str, str]:
    """For units.csv (``reports.export.units_table``, as the experiment report writes it): each
    column of the sweep's CSVs that the experiment's tables do not have, with the experiment
    column whose unit it shares ("" for none). The objective and every effect on it are metric
    values (fractions when `percent`), shares and importances fractions, counts and seconds as
    such; the knobs are stored as the trainer reads them (no unit)."""
    like = {report.metric: "mean", "mean_effect": "effect", "min_effect": "effect", "max_effect": "effect",
            "share_ci_above_0": "share_positive", "share_ci_below_0": "share_positive", "importance": "share_positive",
            "pruned_at_step": "step", "seconds": "wall_s", "complete_trials": "n", "settings": "n", "seeds": "n",
            "trial": "", "retried_as": ""}
    like |= {f"effect.{factor}{end}": "effect" for factor in report.factors for end in ("", ".ci_low", ".ci_high")}
    return like | {knob: "" for knob in report.knobs}


def metric_text(report: SweepReport, value: Any, signed: bool = False) -> str:
    """A metric value (or an effect on it, ``signed``) as a person reads it: percentage points
    with one decimal for a fraction, else 4 significant digits; "" when missing."""
    if is_missing(value):
        return ""
    value = float(value)
    if report.percent:
        return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def interval_text(report: SweepReport, low: Any, high: Any) -> str:
    """``[-1.2, +3.4]``; "" when the interval is missing (one seed)."""
    if is_missing(low) or is_missing(high):
        return ""
    return f"[{metric_text(report, low, signed=True)}, {metric_text(report, high, signed=True)}]"


def share_text(value: Any) -> str:
    """A share in [0, 1] as a whole percent; "" when missing."""
    return "" if is_missing(value) else f"{100 * float(value):.0f}"


# ------------------------------------------------------------------------ tables as pages show them
TEXT_COLUMNS = frozenset({"state", "factor", "target", "knob", "error"})
"""Shown columns that hold words (left-aligned); the rest are numbers (right-aligned)."""


@dataclass(frozen=True)
class ShownTable:
    """A table as report.md and sweep_report.html show it: every cell text (units in the headers),
    and the columns that are numbers (right-aligned)."""

    frame: pd.DataFrame
    numeric: frozenset[str]


def _shown(report: SweepReport, columns: dict[str, list[str]], keep_empty: bool = True) -> ShownTable:
    frame = pd.DataFrame(columns, columns=list(columns)).fillna("").astype(str)
    if not keep_empty:
        frame = frame.loc[:, [c for c in frame.columns if (frame[c] != "").any()]]
    words = TEXT_COLUMNS | {k for k in report.knobs if not _numbers(report.trials[k])}
    return ShownTable(frame.reset_index(drop=True), frozenset(c for c in frame.columns if c not in words))


def _numbers(values: pd.Series) -> bool:
    """Whether a knob's values are all numbers (a categorical knob's may be words or booleans)."""
    present = [v for v in values if not is_missing(v)]
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)


def _knob_cells(report: SweepReport, table: pd.DataFrame) -> dict[str, list[str]]:
    """Each knob's column of `table` rounded to the digits that keep the study's values apart."""
    cells = {}
    for knob in report.knobs:
        digits = knob_digits(report.trials[knob].dropna())
        cells[knob] = [knob_text(v, digits) for v in table[knob]]
    return cells


def _count_text(value: Any) -> str:
    return "" if is_missing(value) else f"{int(value)}"


def shown_best(report: SweepReport) -> ShownTable:
    best, unit = report.best_params, shown_unit(report)
    columns = {"trial": [_count_text(v) for v in best["trial"]],
               f"{report.metric}{unit}": [metric_text(report, v) for v in best[report.metric]]}
    return _shown(report, {**columns, **_knob_cells(report, best)})


def shown_trials(report: SweepReport) -> ShownTable:
    """Every trial; columns empty in every row (no pruning, no retries, no errors) left out."""
    trials, unit = report.trials, shown_unit(report)
    columns = {"trial": [_count_text(v) for v in trials["trial"]], "state": [s.lower() for s in trials["state"]],
               f"{report.metric}{unit}": [metric_text(report, v) for v in trials[report.metric]],
               **_knob_cells(report, trials),
               "pruned at step": [_count_text(v) for v in trials["pruned_at_step"]],
               "time (s)": ["" if is_missing(v) else f"{v:.0f}" for v in trials["seconds"]],
               "retried as": [_count_text(v) for v in trials["retried_as"]],
               "error": ["" if is_missing(v) else str(v) for v in trials["error"]]}
    for factor in report.factors:
        name = f"effect.{factor}"
        columns[f"{name}{unit}"] = [metric_text(report, v, signed=True) for v in trials[name]]
        columns[f"{name} {CI_LEVEL:.0%} CI{unit}"] = [
            interval_text(report, low, high) for low, high in zip(trials[f"{name}.ci_low"], trials[f"{name}.ci_high"])]
    return _shown(report, columns, keep_empty=False)


def shown_importances(report: SweepReport) -> ShownTable:
    table = report.importances
    return _shown(report, {"target": list(table["target"]), "knob": list(table["knob"]),
                           "importance (% of variance)": [share_text(v) for v in table["importance"]]})


def shown_effect_summary(report: SweepReport) -> ShownTable:
    """Per factor across settings; the interval columns left out when no setting has one (one seed)."""
    table, unit = report.effect_summary, shown_unit(report)
    assert table is not None
    return _shown(report, {
        "factor": list(table["factor"]), "settings": [_count_text(v) for v in table["settings"]],
        **{f"{what} effect{unit}": [metric_text(report, v, signed=True) for v in table[f"{what}_effect"]]
           for what in ("mean", "min", "max")},
        "positive (% of settings)": [share_text(v) for v in table["share_positive"]],
        f"{CI_LEVEL:.0%} CI above 0 (% of settings)": [share_text(v) for v in table["share_ci_above_0"]],
        f"{CI_LEVEL:.0%} CI below 0 (% of settings)": [share_text(v) for v in table["share_ci_below_0"]],
    }, keep_empty=False)


def shown_effects(report: SweepReport) -> ShownTable:
    """Per trial and factor; the interval column left out when no setting has one (one seed)."""
    table, unit = report.effects, shown_unit(report)
    assert table is not None
    return _shown(report, {
        "trial": [_count_text(v) for v in table["trial"]], "factor": list(table["factor"]), **_knob_cells(report, table),
        f"effect{unit}": [metric_text(report, v, signed=True) for v in table["effect"]],
        f"{CI_LEVEL:.0%} CI{unit}": [interval_text(report, lo, hi) for lo, hi in zip(table["ci_low"], table["ci_high"])],
        "seeds": [_count_text(v) for v in table["seeds"]],
    }, keep_empty=False)
