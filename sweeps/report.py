"""`dapo-ablate sweep-report`: what a sweep found, from its Optuna study alone.

Tables (pandas; written as CSV, and in report.md and sweep_report.html as a person reads them):

- ``best_params``: the best complete trial's knobs and value;
- ``trials``: one row per trial: number, state, value (pruned: its last intermediate value), the
  knobs, the step it was pruned at, seconds, error, and which trial retried it; in robustness
  mode ``effect.<factor>`` with its CI;
- ``importances``: Optuna's fANOVA parameter importances for the objective (and, in robustness
  mode, for each factor's effect): how much of the variation across trials each knob explains,
  with the number of complete trials they rest on (``complete_trials``). They need at least
  `MIN_IMPORTANCE_TRIALS` complete trials in which some knob varied; otherwise the table is empty
  and the report says why; below `RELIABLE_IMPORTANCE_TRIALS` the pages and the figure warn;
- ``effects`` (robustness mode): one row per complete trial x factor: the knobs, the effect
  (on - off, mean over seeds) and its 95% t interval over seeds (none with one seed), and
  ``effect_summary``: per factor, the effect's mean, range and sign across knob settings.

The CSVs keep the study's values (metric values as fractions, knobs at full precision), and
units.csv names each CSV column's unit, written as the experiment report writes its own
(``reports.export.units_table``). The pages show percentage points and rounded knobs
(`sweeps.report_data`, `sweeps.knobs`: as the sweep's console lines show them); report.md and
sweep_report.html render from the experiment report's templates (``reports/templates/sweep.*.j2``
on its page frame, macros and CSS) with its table writers and escaping. Figures (PNG,
`sweeps.plots`): ``history.png``, ``knobs.png``, ``importances.png``, ``effects.png``;
sweep_report.html embeds them.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from dapo_ablate.sweeps.report_data import (
    RELIABLE_IMPORTANCE_TRIALS,
    ShownTable,
    SweepReport,
    metric_text,
    shown_best,
    shown_effect_summary,
    shown_effects,
    shown_importances,
    shown_trials,
    shown_unit,
    units_like,
)
from dapo_ablate.sweeps.spec import SweepSpec
from dapo_ablate.sweeps.trials import CI_LEVEL

if TYPE_CHECKING:
    from dapo_ablate.reports.pages import FigureView

__all__ = ["MIN_IMPORTANCE_TRIALS", "RELIABLE_IMPORTANCE_TRIALS", "build_report", "read_report", "write_report"]

MIN_IMPORTANCE_TRIALS = 3


def read_report(spec: SweepSpec, importances: bool = True) -> SweepReport:
    """The report of the sweep's study as it stands (without fANOVA's importances when
    `importances` is false: `status` reads only the trials); StudyError when it was never run."""
    from dapo_ablate.sweeps.study import load_study

    factors = [f if isinstance(f, str) else next(iter(f)) for f in spec.factors or []]
    report = build_report(load_study(spec), spec.metric, list(spec.space), factors, importances)
    report.log_knobs |= {knob for knob, dim in spec.space.items() if dim.log}
    report.categorical_knobs |= {knob for knob, dim in spec.space.items() if dim.type == "categorical"}
    return report


def build_report(study: Any, metric: str, knobs: list[str], factors: list[str], importances: bool = True) -> SweepReport:
    """The report's tables from an Optuna study (`knobs`: the searched knobs, in spec order);
    which knobs are log-scaled or categorical is read from the trials' Optuna distributions."""
    trials = study.get_trials(deepcopy=False)
    direction = study.direction.name.lower()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = study.best_trial if complete else None
    best_params = pd.DataFrame(
        [{"trial": best.number, metric: best.value, **best.params}] if best else [], columns=["trial", metric, *knobs]
    )
    shares, note = param_importances(study, complete, knobs, factors) if importances else (pd.DataFrame(), "")
    report = SweepReport(study.study_name, metric, direction, knobs, factors, best_params,
                         trials_table(trials, metric, knobs, factors), shares, note)
    if factors:
        report.effects = effects_table(complete, knobs, factors)
        report.effect_summary = effect_summary(report.effects, factors)
    if best is None:
        report.notes.append("no trial is complete yet, so there is no best setting")
    report.log_knobs, report.categorical_knobs = _knob_kinds(trials)
    return report


def _knob_kinds(trials: list[FrozenTrial]) -> tuple[frozenset[str], frozenset[str]]:
    """The knobs some trial sampled on a log scale, and those sampled from a list of choices."""
    from optuna.distributions import CategoricalDistribution

    distributions = [(name, d) for t in trials for name, d in t.distributions.items()]
    return (frozenset(name for name, d in distributions if getattr(d, "log", False)),
            frozenset(name for name, d in distributions if isinstance(d, CategoricalDistribution)))


def trials_table(trials: list[FrozenTrial], metric: str, knobs: list[str], factors: list[str]) -> pd.DataFrame:
    retried_as = {n: t.number for t in trials for n in t.system_attrs.get("retry_history", [])[-1:]}
    rows = []
    for t in trials:
        value = t.value
        if t.state == TrialState.PRUNED and t.intermediate_values:
            value = t.intermediate_values[max(t.intermediate_values)]
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        row: dict[str, Any] = {"trial": t.number, "state": t.state.name, metric: value}
        row.update({knob: t.params.get(knob) for knob in knobs})
        row.update({"pruned_at_step": t.user_attrs.get("pruned_at_step"), "seconds": seconds,
                    "retried_as": retried_as.get(t.number), "error": t.user_attrs.get("error")})
        for factor in factors:
            effect = (t.user_attrs.get("effects") or {}).get(factor) or {}
            row.update({f"effect.{factor}": effect.get("mean"), f"effect.{factor}.ci_low": effect.get("ci_low"),
                        f"effect.{factor}.ci_high": effect.get("ci_high")})
        rows.append(row)
    columns = ["trial", "state", metric, *knobs, "pruned_at_step", "seconds", "retried_as", "error"]
    columns += [f"effect.{f}{s}" for f in factors for s in ("", ".ci_low", ".ci_high")]
    return pd.DataFrame(rows, columns=columns)


def param_importances(study: Any, complete: list[FrozenTrial], knobs: list[str], factors: list[str]) -> tuple[pd.DataFrame, str]:
    """fANOVA importances of the knobs for the objective (and each factor's effect); a note
    instead when there are too few complete trials or no knob varied."""
    import optuna

    targets: list[tuple[str, Any]] = [("objective", None)]
    targets += [(f"effect.{f}", _effect_target(f)) for f in factors]
    columns = ["target", "knob", "importance", "complete_trials"]
    empty = pd.DataFrame(columns=columns)
    if len(complete) < MIN_IMPORTANCE_TRIALS:
        return empty, (f"parameter importances need at least {MIN_IMPORTANCE_TRIALS} complete trials "
                       f"(this study has {len(complete)}); run more trials")
    varied = [k for k in knobs if len({json.dumps(t.params.get(k)) for t in complete}) > 1]
    if not varied:
        return empty, "parameter importances need a knob whose value differs between complete trials"
    rows = []
    for name, target in targets:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        try:
            values = optuna.importance.get_param_importances(study, evaluator=evaluator, params=varied, target=target)
        except (RuntimeError, ValueError) as err:  # e.g. a target that is constant
            return empty, f"parameter importances could not be computed ({err})"
        rows += [{"target": name, "knob": knob, "importance": value, "complete_trials": len(complete)}
                 for knob, value in values.items()]
    return pd.DataFrame(rows, columns=columns), ""


def _effect_target(factor: str):
    return lambda t: ((t.user_attrs.get("effects") or {}).get(factor) or {}).get("mean", math.nan)


def effects_table(complete: list[FrozenTrial], knobs: list[str], factors: list[str]) -> pd.DataFrame:
    rows = []
    for t in complete:
        for factor in factors:
            effect = (t.user_attrs.get("effects") or {}).get(factor)
            if effect:
                rows.append({"trial": t.number, "factor": factor, **{k: t.params.get(k) for k in knobs},
                             "effect": effect["mean"], "ci_low": effect.get("ci_low"), "ci_high": effect.get("ci_high"),
                             "seeds": effect.get("n")})
    return pd.DataFrame(rows, columns=["trial", "factor", *knobs, "effect", "ci_low", "ci_high", "seeds"])


def effect_summary(effects: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Per factor across knob settings: mean, min and max effect, the share of settings where it
    is positive, and the shares whose CI lies wholly above / below zero."""
    rows = []
    for factor in factors:
        sub = effects[effects["factor"] == factor]
        if sub.empty:
            continue
        has_ci = sub["ci_low"].notna()
        rows.append({
            "factor": factor, "settings": len(sub), "mean_effect": sub["effect"].mean(),
            "min_effect": sub["effect"].min(), "max_effect": sub["effect"].max(),
            "share_positive": (sub["effect"] > 0).mean(),
            "share_ci_above_0": (sub.loc[has_ci, "ci_low"] > 0).sum() / len(sub) if has_ci.any() else None,
            "share_ci_below_0": (sub.loc[has_ci, "ci_high"] < 0).sum() / len(sub) if has_ci.any() else None,
        })
    return pd.DataFrame(rows, columns=["factor", "settings", "mean_effect", "min_effect", "max_effect",
                                       "share_positive", "share_ci_above_0", "share_ci_below_0"])


# ------------------------------------------------------------------------------------ output
HTML_PAGE = "sweep_report.html"


def write_report(report: SweepReport, out: str | Path) -> list[Path]:
    """CSV tables, units.csv, PNG figures, report.md and `HTML_PAGE` (figures embedded) into `out`;
    the paths written. CSVs and units.csv are written as the experiment report writes them
    (``reports.export.write_csv``, ``units_table``)."""
    from dapo_ablate.reports.export import units_table, write_csv
    from dapo_ablate.sweeps.plots import render_figures

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {"best_params.csv": report.best_params, "trials.csv": report.trials, "importances.csv": report.importances}
    if report.effects is not None and report.effect_summary is not None:
        tables.update({"effects.csv": report.effects, "effect_summary.csv": report.effect_summary})
    tables["units.csv"] = units_table(tables, report.percent, [], like=units_like(report))
    for name, table in tables.items():
        write_csv(table, out / name)
    figures = render_figures(report)
    for name, png in figures.items():
        (out / name).write_bytes(png)
    sections = page_sections(report, set(figures))
    (out / "report.md").write_text(report_markdown(report, sections))
    (out / HTML_PAGE).write_text(report_html(report, sections, figures))
    return [out / "report.md", out / HTML_PAGE, *(out / name for name in [*tables, *figures])]


@dataclass(frozen=True)
class PageSection:
    """One section of report.md and the HTML page: its heading, plain-text paragraphs, a warning,
    tables and figures (file name, caption); a page escapes all of it as its format needs."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    warning: str = ""
    tables: list[ShownTable] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)


def page_sections(report: SweepReport, figures: set[str]) -> list[PageSection]:
    """The sections both pages show, in order; `figures`: the PNG names that were drawn."""
    unit = shown_unit(report)
    sections = [PageSection("Best setting", [_best_sentence(report)], tables=[shown_best(report)] if len(report.best_params) else [],
                            figures=_figures(figures, "knobs.png", f"{report.metric}{unit} against each knob "
                                             "(log axis for knobs sampled on a log scale); the star is the best trial."))]
    importances = [f"How much of the variation of the objective{' and of each factor’s effect' * bool(report.factors)} "
                   "across complete trials each knob explains (fANOVA, Hutter et al. 2014), in % of variance."]
    if report.importances.empty:
        importances.append(f"{report.importance_note}.")
    sections.append(PageSection("Parameter importances (fANOVA)", importances, report.importance_warning,
                                [shown_importances(report)] if len(report.importances) else [],
                                _figures(figures, "importances.png", "fANOVA importance of each knob, % of variance.")))
    if report.effects is not None and report.effect_summary is not None:
        sections.append(_effects_section(report, report.effects, report.effect_summary, figures))
    sections.append(PageSection("Optimization history", figures=_figures(
        figures, "history.png", f"{report.metric}{unit} by trial number: complete trials, pruned ones at their last "
        "reported value, and the best so far.")))
    if report.trials.empty:
        sections.append(PageSection("Trials", ["The study has no trial yet."]))
    else:
        sections.append(PageSection("Trials", [f"Every trial of the study{_in_pp(report)}."], tables=[shown_trials(report)]))
    return sections


def _in_pp(report: SweepReport) -> str:
    return f"; {report.metric} and effects on it in percentage points (pp)" if report.percent else ""


def _figures(drawn: set[str], name: str, caption: str) -> list[tuple[str, str]]:
    return [(name, caption)] if name in drawn else []


def _best_sentence(report: SweepReport) -> str:
    if not len(report.best_params):
        return "No complete trial yet."
    best = report.best_params.iloc[0]
    knobs = ", ".join(f"{knob}={cell}" for knob, cell in zip(report.knobs, shown_best(report).frame.iloc[0, 2:]))
    return (f"Trial {int(best['trial'])} is the best complete trial: {report.metric} "
            f"{metric_text(report, best[report.metric])}{' pp' * report.percent} at {knobs}.")


def _effects_section(report: SweepReport, effects: pd.DataFrame, summary: pd.DataFrame, figures: set[str]) -> PageSection:
    with_interval = bool((pd.to_numeric(effects["seeds"], errors="coerce") >= 2).any())
    interval = (f"with a {CI_LEVEL:.0%} t interval over seeds" if with_interval
                else "one seed per setting, so no interval (seeds_per_trial: 2 or more gives one)")
    text = [f"Effect = on - off at each knob setting, mean over seeds, {interval}{_in_pp(report)}. The trial's value "
            "is the full-on cell's objective. First each factor across the settings, then each setting."]
    caption = (f"Each factor's effect against each knob; error bars: the {CI_LEVEL:.0%} t interval over seeds."
               if with_interval else "Each factor's effect against each knob; one seed per setting, so no error bars.")
    return PageSection("Factor effects across knob settings", text, tables=[shown_effect_summary(report), shown_effects(report)],
                       figures=_figures(figures, "effects.png", caption))


def _headline(report: SweepReport) -> list[str]:
    states = report.trials["state"].value_counts().to_dict()
    counts = ", ".join(f"{count} {state.lower()}" for state, count in states.items()) or "none"
    unit = (" Metric values read in percentage points (pp); the CSV files keep fractions (units.csv says each column's unit)."
            if report.percent else "")
    return [f"Objective: {report.direction} {report.metric}; trials: {counts}.{unit}", *(f"{note}." for note in report.notes)]


@dataclass(frozen=True)
class SectionView:
    """A `PageSection` as one page renders it: its tables written (Markdown, or HTML marked safe)
    by the experiment report's table writers, its figures as `reports.pages.FigureView`s."""

    title: str
    paragraphs: list[str]
    warning: str
    tables: list[str]
    figures: list[FigureView]


def _section_views(sections: list[PageSection], figures: dict[str, bytes] | None) -> list[SectionView]:
    """The sections as report.md (`figures` None: figures linked by name) or the HTML page
    (figures embedded as base64) renders them; tables without rows left out."""
    import markupsafe

    from dapo_ablate.reports.export import html_table, markdown_table
    from dapo_ablate.reports.pages import FigureView

    views = []
    for section in sections:
        tables: list[str] = []
        for table in section.tables:
            if len(table.frame):
                numeric = [column in table.numeric for column in table.frame.columns]
                tables.append(markdown_table(table.frame, numeric).rstrip("\n") if figures is None
                              else markupsafe.Markup(html_table(table.frame, numeric)))
        shown = [FigureView(name, caption, "" if figures is None else base64.b64encode(figures[name]).decode("ascii"))
                 for name, caption in section.figures]
        views.append(SectionView(section.title, section.paragraphs, section.warning, tables, shown))
    return views


def report_markdown(report: SweepReport, sections: list[PageSection]) -> str:
    """report.md (``reports/templates/sweep.md.j2``): every text through the ``md`` filter, the
    tables by ``reports.export.markdown_table``, figures as links to the PNG files beside it."""
    from dapo_ablate.reports.pages import render_page

    return render_page("sweep.md.j2", name=report.name, headline=_headline(report),
                       sections=_section_views(sections, None))


def report_html(report: SweepReport, sections: list[PageSection], figures: dict[str, bytes]) -> str:
    """`HTML_PAGE` (``reports/templates/sweep.html.j2`` in the experiment report's frame and CSS):
    self-contained (figures as base64 data URIs, no scripts), autoescaped, the tables by
    ``reports.export.html_table``."""
    from dapo_ablate.reports.pages import render_page

    return render_page("sweep.html.j2", title=f"Sweep {report.name}", headline=_headline(report),
                       sections=_section_views(sections, figures))
