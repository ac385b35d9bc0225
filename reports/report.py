"""``write_report``: analyse a results table and write every table, figure and report file."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from itertools import combinations, product
from pathlib import Path
from typing import Callable

import markupsafe
import numpy as np
import pandas as pd

from dapo_ablate.core.contracts import SETTING_COLUMN

from . import plots
from .analysis import Analysis, analyze
from .claims import CLAIM_COLUMNS
from .compute_curves import COMPUTE_COLUMNS_CURVES, CURVE_EFFECT_COLUMNS, CurveAnalysis, analyze_curves
from .curve_plots import curve_png
from .evidence import gather_evidence, read_predictions, single_setting, write_evidence
from .export import TableFiles, display_frame, to_html, to_markdown, units_table, write_csv, write_table
from .headline import cell_values
from .inference import estimate
from .decision import adaptive_decision
from .looks import look_sentences, looks_table, write_looks
from .options import VECTOR_FORMATS, ReportOptions, report_options
from .orderings import comparisons_at
from .pages import TABLES, FigureView, cumulative_display, render_page, table_captions
from .summary import empty_supported, summary_sections
from .table import ReportInputError, cell_label, validate_curves
from .transfer_report import write_transfer_report

REPORT_ORDERINGS_SHOWN = 3  # report.md/html show this many orderings; cumulative.csv has all


PAPER_LABEL = "DAPO paper (Qwen2.5-32B, AIME 2024)"


def _figure_captions(analysis: Analysis) -> dict[str, str]:
    """What each figure shows, for the pages (one caption per PNG file)."""
    conf, metric, k = f"{analysis.confidence:.0%} CI", analysis.metric, len(analysis.factors)
    paper = (
        f" Grey diamonds (dashed line, right-hand axis): the DAPO paper's numbers for the same steps ({PAPER_LABEL}, avg@32): "
        "another model, data set and budget, so compare the shape of the path, not its level."
        if analysis.paper_reference and analysis.percent
        else ""
    )
    return {
        "cumulative.png": f"Cumulative path along each ordering shown: each point is the cell with the factors up to it "
        f"switched on ({metric}, mean with {conf}); a step's gain is its point minus the point before. Filled points "
        f"are cells that were run; hollow ones were not run, their mean is the fitted model's prediction.{paper}",
        "shapley.png": f"Shapley value (mean gain over all orderings) and Banzhaf value (= main effect) of each factor, "
        f"with {conf}s.",
        "effects.png": f"Forest plot: each factor's Shapley value (top) and each main effect and two-factor interaction "
        f"(bottom), with its {conf}. Filled points are claims (they pass their family's adjusted test), hollow ones were tested and do not pass, "
        "small diamonds belong to no claims family of this design (a full design tests Shapley values, not main effects).",
        "gain_by_position.png": f"Each factor's mean gain by the position at which an ordering adds it (1: onto the "
        f"baseline; {k}: onto all the others), with {conf}s. A rising line: the factor helps more once others are on.",
        "interactions.png": f"Interaction plots, one panel per two-factor interaction: mean {metric} with the first factor "
        f"off and on (x axis), the second off (dashed) or on (solid), averaged over the other factors, with {conf}s. "
        "Parallel lines mean no interaction. Each title gives the interaction effect, ((on, on) - (off, on) - (on, off) "
        "+ (off, off)) / 2, with its CI; \"supported\" marks one that passes the adjusted test.",
        "learning_curves.png": f"Learning curves, one panel per cell (title: the cell and its final mean {metric}): thin "
        "lines are seeds, the thick line their mean, the dashed grey line the baseline cell's mean for reference.",
        "learning_curves_overlay.png": f"Learning curves of all cells on one axis (mean over seeds; the baseline black "
        f"dashed, the full cell thick), the legend ordered by final mean {metric}.",
        "compute_curves.png": f"Compute curves: each cell's {metric} against cumulative generated tokens (log axis; points: "
        "its runs' evaluations), with the saturating curve fitted to them (legend: the cell and its asymptote A). A curve "
        "is solid up to the last evaluation of its runs and dashed beyond it: that part is an extrapolation, not data. A "
        "cell whose curve has not bent toward a ceiling within its data (half the gain only past its last evaluation) is "
        "dotted and faded: its asymptote is not enough data. Dotted grey lines mark the lowest and highest asymptotes of "
        "the bent curves.",
        "signals_by_cell.png": "Training signals per cell: one panel per signal (verl's names), each cell's per-step "
        "mean over its seeds as one line (the baseline black dashed, the full cell thick).",
        "signals.png": "Training signals by technique: for each signal (rows, verl's metric names) and technique "
        "(columns), the per-step mean over all runs with the technique off (blue) and on (orange); the band is the "
        "95% t interval of that mean over the runs. Runs at one level differ in the other techniques, so the band "
        "includes their effects. A signal only one technique moves (train/num_gen_batches: dynamic sampling) is "
        "compared, in the other techniques' panels, over the runs with that technique on.",
    }


def interaction_means(analysis: Analysis) -> pd.DataFrame:
    """The 2x2 means of every two-factor interaction the effects table has, averaged over the
    other factors' levels, each an exact contrast of the cell means with its CI; empty when the
    design lacks cells (every cell mean is needed). Columns: see ``plots.interaction_plots``."""
    values = cell_values(analysis)
    factors, rows = analysis.factors, []
    if np.isnan(values.point).any():
        return pd.DataFrame()
    masks = np.arange(2 ** len(factors))
    effects = analysis.effects.set_index("term")
    supported = set(analysis.claims.loc[analysis.claims["kind"] == "interaction", "term"])
    for i, j in combinations(range(len(factors)), 2):
        term = f"{factors[i]}:{factors[j]}"
        if term not in effects.index:
            continue
        levels = list(product((0, 1), (0, 1)))
        weights = np.stack([((masks >> i & 1) == a) & ((masks >> j & 1) == b) for a, b in levels], axis=-1)
        weights = weights / weights.sum(axis=0)  # [2**k, 4]: the mean over the other factors' cells
        est = estimate(values.fit, values.contrasts(weights.T), values.noise, values.confidence)
        effect = effects.loc[term]
        for n, (a, b) in enumerate(levels):
            rows.append({
                "a": factors[i], "b": factors[j], "a_level": a, "b_level": b, "mean": est.estimate[n],
                "ci_low": est.ci_low[n], "ci_high": est.ci_high[n], "effect": effect["effect"],
                "effect_ci_low": effect["ci_low"], "effect_ci_high": effect["ci_high"], "supported": term in supported,
            })  # fmt: skip
    return pd.DataFrame(rows)


def signals_table(signals: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """Per-step training signals checked for the signals figure, with verl's ``pg_clipfrac``
    (``clipfrac_low + clipfrac_high``) added when both bounds are there. Raises ReportInputError
    naming a missing column."""
    for column in [*factors, "step"]:
        if column not in signals.columns:
            raise ReportInputError(f"the training signals lack column '{column}'; give one row per run and step")
    if {"clipfrac_low", "clipfrac_high"} <= set(signals.columns) and "pg_clipfrac" not in signals.columns:
        signals = signals.assign(pg_clipfrac=signals["clipfrac_low"] + signals["clipfrac_high"])
    return signals


def _figures(
    analysis: Analysis, curves: pd.DataFrame | None, signals: pd.DataFrame | None, fitted: CurveAnalysis | None
) -> dict[str, bytes]:
    """PNG bytes by file name, for the figures the data support, in report order (``fitted``: the
    compute curves of ``curves``, when they could be fitted)."""
    metric, percent, confidence = analysis.metric, analysis.percent, analysis.confidence
    made = {
        "cumulative.png": plots.cumulative_plot(
            cumulative_display(analysis, REPORT_ORDERINGS_SHOWN), metric, percent, confidence,
            cell_label(0, analysis.factors), PAPER_LABEL,
        ),  # fmt: skip
        "shapley.png": plots.shapley_plot(analysis.shapley, metric, percent, confidence),
        "gain_by_position.png": plots.position_plot(analysis.orderings, metric, percent),
        "effects.png": plots.effects_forest_plot(
            analysis.shapley, analysis.effects, analysis.tests, metric, percent, confidence
        ),
        "interactions.png": plots.interaction_plots(interaction_means(analysis), metric, percent, confidence),
        "learning_curves.png": None if curves is None else plots.curves_plot(curves, analysis.factors, metric, percent),
        "learning_curves_overlay.png": None if curves is None else plots.curves_overlay_plot(
            curves, analysis.factors, metric, percent
        ),  # fmt: skip
        "signals.png": None if signals is None else plots.signals_plot(signals, analysis.factors),
        "signals_by_cell.png": None if signals is None else plots.signals_by_cell_plot(signals, analysis.factors),
        "compute_curves.png": None if fitted is None else curve_png(fitted, curves, analysis.factors, metric, percent),
    }
    return {name: png for name, png in made.items() if png is not None}


def _orderings_display(analysis: Analysis) -> pd.DataFrame:
    """The order table as the pages show it: ``comparisons`` (distinct cell pairs behind a row)
    instead of ``n_orderings``, and min / max left empty where a row is one comparison (positions
    1 and k: one comparison shared by (k-1)! orderings, not (k-1)! results)."""
    table = analysis.orderings
    if table.empty:
        return table
    k = len(analysis.factors)
    shown = table.drop(columns="n_orderings")
    shown.insert(2, "comparisons", [comparisons_at(k, str(p)) for p in table["position"]])
    shown.loc[shown["comparisons"] == 1, ["min", "max"]] = np.nan
    return shown


def ranked_cells(analysis: Analysis) -> pd.DataFrame:
    """The cells table as the pages show it: ranked by mean (rank 1 the highest; cells the design
    lacks have no rank), the factor columns left to the cell label."""
    return analysis.cells.sort_values(["rank", "cell"], na_position="last").drop(columns=analysis.factors)


def compute_curves_display(table: pd.DataFrame) -> pd.DataFrame:
    """The compute-curve effects as the pages show them: the effect on the midpoint as the ratio of
    the compute to half the gain (exp of the effect on log C_mid, with its interval), not the log."""
    if table.empty:
        return table
    shown = table.assign(midpoint_ratio_ci_low=np.exp(table["midpoint_ci_low"].to_numpy(float)),
                         midpoint_ratio_ci_high=np.exp(table["midpoint_ci_high"].to_numpy(float)))  # fmt: skip
    return shown[[
        "term", "asymptote_effect", "asymptote_ci_low", "asymptote_ci_high", "asymptote_p_adjusted",
        "midpoint_ratio", "midpoint_ratio_ci_low", "midpoint_ratio_ci_high", "midpoint_p_adjusted",
        "final_effect", "final_ci_low", "final_ci_high", "verdict",
    ]]  # fmt: skip


TABLE_DISPLAYS = {
    "cumulative": cumulative_display,
    "orderings": _orderings_display,
    "compute_curves": lambda analysis: compute_curves_display(analysis.compute_curves),
    "cells": ranked_cells,
}
"""How a table's .md / .tex and the pages show it, where that differs from its .csv (the pages
show only the first orderings of the cumulative table)."""


def _report_tables(analysis: Analysis) -> list[tuple[str, str, pd.DataFrame]]:
    """(section title, table name, display table) in report order; the looks only for an adaptive
    design."""
    looks = [("Looks of the adaptive design", "looks", analysis.looks.drop(columns="unit"))] if len(analysis.looks) else []
    return [
        *looks,
        ("Claims", "claims", analysis.claims),
        ("Cumulative tables", "cumulative", cumulative_display(analysis, REPORT_ORDERINGS_SHOWN)),
        ("Shapley and Banzhaf values", "shapley", analysis.shapley),
        ("Order dependence", "orderings", TABLE_DISPLAYS["orderings"](analysis)),
        ("Factorial effects", "effects", analysis.effects),
        ("Leave-one-out and add-one", "leave_one_out", analysis.leave_one_out),
        ("Compute", "compute", analysis.compute.drop(columns=analysis.factors)),  # the cell label says it
        ("Equal compute", "compute_matched", analysis.compute_matched),
        ("Compute curves", "compute_curves", TABLE_DISPLAYS["compute_curves"](analysis)),
        ("Cells ranked by mean", "cells", TABLE_DISPLAYS["cells"](analysis)),
    ]


FIGURE_AFTER = {
    "cumulative": ["cumulative.png"],
    "shapley": ["shapley.png"],
    "orderings": ["gain_by_position.png"],
    "effects": ["effects.png", "interactions.png"],
    "compute_curves": ["compute_curves.png"],
    "cells": ["learning_curves.png", "learning_curves_overlay.png", "signals.png", "signals_by_cell.png"],
}


def _empty(name: str, analysis: Analysis) -> str:
    """What an empty table means: nothing is supported, or the design does not give the table."""
    return f"No claims. {empty_supported(analysis)}" if name == "claims" else "Not computed."


@dataclass(frozen=True)
class TableBlock:
    """One table section of a page: title, caption, the rendered table (Markdown or HTML; empty
    when the table has no rows, then ``empty`` says why), a note under it, and its figures."""

    title: str
    caption: str
    table: str
    empty: str
    note: str
    figures: list[FigureView]


def _blocks(analysis: Analysis, figures: dict[str, bytes] | list[str], html_page: bool) -> list[TableBlock]:
    """The table sections of report.md (``html_page`` False) or report.html, in report order."""
    captions, figure_captions = table_captions(analysis), _figure_captions(analysis)
    blocks = []
    for title, name, table in _report_tables(analysis):
        shown = display_frame(table, analysis.percent, analysis.factors)
        rendered = markupsafe.Markup(to_html(table, shown)) if html_page else to_markdown(table, shown).rstrip("\n")
        note = _note(analysis, name, table)
        shown_figures = [
            FigureView(
                figure, figure_captions[figure], base64.b64encode(figures[figure]).decode("ascii") if html_page else ""
            )
            for figure in FIGURE_AFTER.get(name, [])
            if figure in figures
        ]
        blocks.append(TableBlock(title, captions[name], rendered if len(table) else "", _empty(name, analysis), note, shown_figures))
    return blocks


def _note(analysis: Analysis, name: str, table: pd.DataFrame) -> str:
    """The line under a table: what it leaves out, how it was made."""
    if name == "cumulative" and table["ordering"].nunique() < analysis.cumulative["ordering"].nunique():
        return "Only the first orderings are shown; cumulative.csv has all of them."
    return analysis.table_notes.get(name, "")


def report_markdown(analysis: Analysis, figures: list[str]) -> str:
    """report.md: summary, then each table (and its figures when written)."""
    return render_page(
        "report.md.j2",
        metric=analysis.metric,
        summary=list(summary_sections(analysis).items()),
        blocks=_blocks(analysis, figures, html_page=False),
        empty_supported=empty_supported(analysis),
    )


def report_html(analysis: Analysis, figures: dict[str, bytes]) -> str:
    """report.html: self-contained (inline CSS, figures as base64 data URIs, no scripts)."""
    return render_page(
        "report.html.j2",
        title=f"Ablation report: {analysis.metric}",
        summary=list(summary_sections(analysis).items()),
        blocks=_blocks(analysis, figures, html_page=True),
        empty_supported=empty_supported(analysis),
    )


def write_report(
    results: pd.DataFrame,
    factors: list[str],
    out_dir: str | Path,
    *,
    options: ReportOptions | None = None,
    curves: pd.DataFrame | None = None,
    signals: pd.DataFrame | None = None,
    **changes,
) -> dict[str, Path]:
    """Analyse ``results`` and write the report files into ``out_dir``; returns {file name: path}.

    Always claims.csv (the summary's "supported by the data" list, one row per sentence) and
    units.csv (each CSV column's unit). Tables: cells (ranked), cumulative, orderings, shapley,
    effects, leave_one_out, compute, compute_matched and compute_curves, each as .csv / .md / .tex
    per ``options.formats``, and intervals.csv (every interval, its SE, df and method) with csv;
    looks.csv / looks.md with ``options.looks`` (an adaptive design); figures (png, each also in
    report.html with its caption): cumulative.png, shapley.png, gain_by_position.png, effects.png,
    interactions.png; with ``curves``: learning_curves.png, learning_curves_overlay.png and
    compute_curves.png; with ``signals`` (one row per run and training step: the factor columns,
    ``step`` and the trainer's signals): signals.png and signals_by_cell.png; where the data
    support them; report.md; report.html; predictions.yaml, settings.csv, published.csv and, given
    ``options.predictions``, confirmation.csv and prediction_ranks.csv (``evidence``). ``options``: see ``ReportOptions`` (metric, orderings, formats,
    confidence, design, adjust, per_effect_tests, equivalence_margin, echo); ``changes``: any of
    its fields by keyword (``write_report(results, factors, out, formats=["csv"])``). A
    ``setting`` column naming two or more settings makes it a transfer study
    (``transfer_report.write_transfer_report``). Raises ReportInputError before writing anything
    when the input cannot be used. ``options.echo`` (e.g. ``print``) receives the plain-language
    summary.
    """
    options = report_options(options, changes)
    chosen = options.chosen_formats()
    factors, predictions = list(factors), read_predictions(options)
    if SETTING_COLUMN in results.columns and results[SETTING_COLUMN].astype(str).nunique(dropna=False) > 1:
        return write_transfer_report(results, factors, Path(out_dir), options, predictions)  # one block per setting
    if curves is not None:
        curves = validate_curves(curves, factors, options.metric)
    if signals is not None:
        signals = signals_table(signals, factors)
    analysis, fitted = report_analysis(results, factors, options, curves)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {"claims.csv": out / "claims.csv"}
    write_csv(analysis.claims[CLAIM_COLUMNS], written["claims.csv"])
    written |= _write_tables(analysis, TableFiles(out, frozenset(chosen), analysis.percent, tuple(factors)))
    written |= evidence_files(analysis, results, options, predictions, out)
    written |= write_looks(options.looks, out, options.looks_alpha)
    written["units.csv"] = out / "units.csv"
    write_csv(units_table(_csv_tables(analysis, written), analysis.percent, factors), written["units.csv"])
    with plots.vector_formats(tuple(sorted(chosen & set(VECTOR_FORMATS)))):
        figures = _figures(analysis, curves, signals, fitted) if chosen & {"png", "html", *VECTOR_FORMATS} else {}
    written |= _write_pages(analysis, out, chosen, figures)
    if options.echo is not None:
        echo_summary(analysis, options.echo)
    return written


def evidence_files(analysis: Analysis, results: pd.DataFrame, options: ReportOptions, predictions, out: Path) -> dict[str, Path]:
    """The evidence files of a single experiment (``evidence.write_evidence``); its sections go
    to the analysis's summary."""
    name = single_setting(options)
    evidence = gather_evidence({name: analysis}, {name: results}, options, predictions)
    analysis.evidence = evidence.sections
    return write_evidence(evidence, out)


def report_analysis(
    results: pd.DataFrame, factors: list[str], options: ReportOptions, curves: pd.DataFrame | None
) -> tuple[Analysis, CurveAnalysis | None]:
    """``analyze`` with what the report adds to it: the factors' levels, an adaptive design's looks,
    and the compute curves of ``curves`` (checked by ``validate_curves``) with their effects, or
    the sentence saying why there are none; returns the curve fits too (for the figure)."""
    analysis = analyze(results, factors, options=options, curves=curves)
    analysis.levels = tuple(info for info in options.levels if info.name in factors)
    if options.looks:  # an adaptive design: its looks decide (decision.adaptive_decision), shown first
        analysis.looks = looks_table(options.looks)
        analysis.look_lines = look_sentences(options.looks, options.looks_alpha)
        analysis.decision = adaptive_decision(options.looks, options.looks_alpha, analysis.percent)
        analysis.claims = analysis.decision.claims
    analysis.compute_curves = pd.DataFrame(columns=CURVE_EFFECT_COLUMNS)
    if curves is None:
        analysis.table_notes["compute_curves"] = "Not computed: the runs logged no evaluation curve (a results CSV has final values only)."
        return analysis, None
    compute = next((c for c in COMPUTE_COLUMNS_CURVES if c in curves and curves[c].notna().any()), None)
    if compute is None:
        analysis.table_notes["compute_curves"] = "Not computed: the evaluation curves carry no cumulative token counts."
        return analysis, None
    try:
        fitted = analyze_curves(curves, analysis.factors, analysis.metric, compute, alpha=1 - analysis.confidence)
    except ReportInputError as error:
        analysis.table_notes["compute_curves"] = f"Not computed: {error}."
        return analysis, None
    analysis.compute_curves, analysis.table_notes["compute_curves"] = with_final_effects(fitted.effects, analysis), " ".join(fitted.notes)
    outside = int((~fitted.runs["asymptote"].between(0, 1) & fitted.runs["fitted"]).sum()) if analysis.percent else 0
    if outside:
        analysis.table_notes["compute_curves"] += (
            f" {outside} of {int(fitted.runs['fitted'].sum())} fitted runs put the asymptote outside 0-100 pp: their "
            "curves have not bent toward a ceiling within the data, so the effects on the asymptote are extrapolations; "
            "train longer (more evaluations past the bend) before reading them.")
    return analysis, fitted


def with_final_effects(effects: pd.DataFrame, analysis: Analysis) -> pd.DataFrame:
    """The compute-curve table with each technique's effect on the final metric taken from the
    report's effects table, so one quantity carries one interval on the page (its main effect on
    the final evaluation, every run counted), not a second one from the fitted runs only."""
    main = analysis.effects.set_index("term")
    table = effects.copy()
    for column, source in (("final_effect", "effect"), ("final_ci_low", "ci_low"), ("final_ci_high", "ci_high")):
        table[column] = table["term"].map(main[source]).astype(float)
    return table


def _csv_tables(analysis: Analysis, written: dict[str, Path]) -> dict[str, pd.DataFrame]:
    """The frames behind the CSV files written so far, by file name (for units.csv)."""
    frames = {"claims.csv": analysis.claims[CLAIM_COLUMNS], "intervals.csv": analysis.intervals,
              "looks.csv": analysis.looks, **{f"{name}.csv": getattr(analysis, name) for name in TABLES}}  # fmt: skip
    return {name: frames[name] for name in written if name in frames}


def _write_tables(analysis: Analysis, files: TableFiles) -> dict[str, Path]:
    """Every table in ``files.formats``, and intervals.csv with csv."""
    written: dict[str, Path] = {}
    captions = table_captions(analysis)
    for name in TABLES:
        display = TABLE_DISPLAYS[name](analysis) if name in TABLE_DISPLAYS else None
        written |= write_table(name, getattr(analysis, name), files, captions[name], display)
    if "csv" in files.formats:
        written["intervals.csv"] = files.out_dir / "intervals.csv"
        write_csv(analysis.intervals, written["intervals.csv"])
    return written


def _write_pages(analysis: Analysis, out: Path, chosen: set[str], figures: dict[str, bytes]) -> dict[str, Path]:
    """The figures (png) and report.md / report.html, as ``chosen`` asks."""
    written: dict[str, Path] = {}
    for name, png in figures.items():
        if "png" in chosen:
            written[name] = out / name
            written[name].write_bytes(png)
        for fmt, data in getattr(png, "vectors", {}).items():  # the same figure as PDF / SVG, for papers
            vector = Path(name).with_suffix(f".{fmt}").name
            written[vector] = out / vector
            written[vector].write_bytes(data)
    if "md" in chosen:
        written["report.md"] = out / "report.md"
        written["report.md"].write_text(report_markdown(analysis, list(figures) if "png" in chosen else []))
    if "html" in chosen:
        written["report.html"] = out / "report.html"
        written["report.html"].write_text(report_html(analysis, figures))
    return written


def echo_summary(analysis: Analysis, echo: Callable[[str], None]) -> None:
    """The plain-language summary, one line per call of ``echo``."""
    for heading, lines in summary_sections(analysis).items():
        echo(f"{heading}:")
        for line in lines:
            echo(f"  - {line}")
        if not lines:
            echo(f"  {empty_supported(analysis)}")
