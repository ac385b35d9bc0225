"""``write_report``: analyse a results table and write every table, figure and report file."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jinja2
import markupsafe
import pandas as pd

from . import plots
from .analysis import Analysis, analyze
from .export import to_html, to_markdown, display_frame, write_table
from .claims import CLAIM_COLUMNS
from .summary import EMPTY_SUPPORTED, summary_sections
from .table import ReportInputError, validate_curves

FORMATS = ("csv", "md", "tex", "png", "html")
REPORT_ORDERINGS_SHOWN = 3  # report.md/html show this many orderings; cumulative.csv has all


def _captions(analysis: Analysis) -> dict[str, str]:
    unit = " (percentage points)" if analysis.percent else ""
    conf = f"{analysis.confidence:.0%} CI"
    paper = (
        " Column paper: the DAPO paper's numbers (Qwen2.5-32B, AIME 2024 avg@32, one run per row)."
        if analysis.paper_reference and analysis.percent
        else ""
    )
    return {
        "claims": "Claims (claims.csv): one row per sentence of \"Supported by the data\"; estimate and "
        f"{conf}{unit}, raw p-value and the family-adjusted p-value the claim rests on.",
        "cells": f"Cells: runs, mean (for these seeds: seed-adjusted when a cell lacks a seed the others ran), sd over seeds, "
        f"{conf} of {analysis.metric}{unit}.",
        "cumulative": f"Cumulative tables: each step adds one factor to the row above; delta is the gain over it, with {conf}.{paper}",
        "orderings": "Order dependence: each factor's gain by the position at which an ordering adds it, and over all orderings (mean with "
        f"{conf}, min, max, share of orderings in which it helps).",
        "shapley": f"Shapley values (mean gain over all orderings) and Banzhaf values (mean over edges = main effect), {conf}{unit}.",
        "effects": f"Factorial effects (-1/+1 coding, effect = 2 x OLS coefficient): main effects and two-factor interactions "
        f"(aliased terms named as their whole chain), {conf}{unit}, residual df, raw and family-adjusted p-values.",
        "leave_one_out": f"Leave-one-out (full minus full without the factor) and add-one (baseline plus the factor minus baseline), {conf}{unit}.",
        "compute": "Compute per cell (means over seeds): tokens generated include those discarded by dynamic sampling; "
        f"gain is over the baseline{unit}; gain_per_added_mtok divides it by the million tokens the cell generated "
        "beyond the baseline (empty where it adds none); mean_at_budget (when shown) is the mean at the equal-compute budget.",
        "compute_matched": "Equal compute: each effect at equal training steps (effect, CI) beside the same effect with every run "
        "read at one generated-token budget (budget_tokens), interpolated linearly between its evaluations"
        f"{unit}. Empty when the results carry no evaluation curves with token counts.",
    }


def _cumulative_display(analysis: Analysis, limit: int | None = None) -> pd.DataFrame:
    """The cumulative table with the paper's numbers beside the ``paper`` ordering."""
    table = analysis.cumulative
    if limit is not None:
        table = table[table["ordering"].isin(list(dict.fromkeys(table["ordering"]))[:limit])]
    if not (analysis.paper_reference and analysis.percent):
        return table
    paper = [
        (
            analysis.paper_reference[row.step]
            if row.ordering == "paper" and row.step < len(analysis.paper_reference)
            else None
        )
        for row in table.itertuples(index=False)
    ]
    shown = table.copy()
    shown.insert(
        shown.columns.get_loc("mean") + 1, "paper", [float("nan") if v is None else float(v) for v in paper]
    )
    return shown


def _figures(analysis: Analysis, curves: pd.DataFrame | None) -> dict[str, bytes]:
    """PNG bytes by file name, for the figures the data support."""
    made = {
        "shapley.png": plots.shapley_plot(
            analysis.shapley, analysis.metric, analysis.percent, analysis.confidence
        ),
        "gain_by_position.png": plots.position_plot(analysis.orderings, analysis.metric, analysis.percent),
        "interactions.png": plots.interaction_plot(analysis.effects, analysis.factors, analysis.percent),
        "learning_curves.png": (
            None
            if curves is None
            else plots.curves_plot(curves, analysis.factors, analysis.metric, analysis.percent)
        ),
    }
    return {name: png for name, png in made.items() if png is not None}


def _report_tables(analysis: Analysis) -> list[tuple[str, str, pd.DataFrame]]:
    """(section title, table name, display table) in report order."""
    return [
        ("Claims", "claims", analysis.claims),
        ("Cumulative tables", "cumulative", _cumulative_display(analysis, REPORT_ORDERINGS_SHOWN)),
        ("Shapley and Banzhaf values", "shapley", analysis.shapley),
        ("Order dependence", "orderings", analysis.orderings),
        ("Factorial effects", "effects", analysis.effects),
        ("Leave-one-out and add-one", "leave_one_out", analysis.leave_one_out),
        ("Compute", "compute", analysis.compute.drop(columns=analysis.factors)),  # the cell label says it
        ("Equal compute", "compute_matched", analysis.compute_matched),
        ("Cells", "cells", analysis.cells.drop(columns=analysis.factors)),
    ]


FIGURE_AFTER = {
    "shapley": ["shapley.png"],
    "orderings": ["gain_by_position.png"],
    "effects": ["interactions.png"],
    "cells": ["learning_curves.png"],
}


def _empty(name: str) -> str:
    """What an empty table means: no claim passed, or the design does not give the table."""
    return "No claims: no statistic passes its family's adjusted test." if name == "claims" else "Not computed."


@dataclass(frozen=True)
class FigureView:
    """A figure as a page shows it: its file name and, on an HTML page, its PNG as base64."""

    name: str
    base64: str = ""


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


TEMPLATES = Path(__file__).with_name("templates")


@functools.cache
def _environment() -> jinja2.Environment:
    """The report pages' templates; HTML templates autoescape, Markdown ones do not."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render_page(template: str, **context) -> str:
    """Render ``reports/templates/<template>`` (ending in exactly one newline); every page also
    gets ``empty_supported``."""
    page = _environment().get_template(template).render(empty_supported=EMPTY_SUPPORTED, **context)
    return page.rstrip("\n") + "\n"


def _blocks(analysis: Analysis, figures: dict[str, bytes] | list[str], html_page: bool) -> list[TableBlock]:
    """The table sections of report.md (``html_page`` False) or report.html, in report order."""
    captions = _captions(analysis)
    blocks = []
    for title, name, table in _report_tables(analysis):
        shown = display_frame(table, analysis.percent, analysis.factors)
        rendered = markupsafe.Markup(to_html(table, shown)) if html_page else to_markdown(table, shown).rstrip("\n")
        note = ""
        if name == "cumulative" and table["ordering"].nunique() < analysis.cumulative["ordering"].nunique():
            note = "Only the first orderings are shown; cumulative.csv has all of them."
        shown_figures = [
            FigureView(figure, base64.b64encode(figures[figure]).decode("ascii") if html_page else "")
            for figure in FIGURE_AFTER.get(name, [])
            if figure in figures
        ]
        blocks.append(TableBlock(title, captions[name], rendered if len(table) else "", _empty(name), note, shown_figures))
    return blocks


def report_markdown(analysis: Analysis, figures: list[str]) -> str:
    """report.md: summary, then each table (and its figures when written)."""
    return render_page(
        "report.md.j2",
        metric=analysis.metric,
        summary=list(summary_sections(analysis).items()),
        blocks=_blocks(analysis, figures, html_page=False),
    )


def report_html(analysis: Analysis, figures: dict[str, bytes]) -> str:
    """report.html: self-contained (inline CSS, figures as base64 data URIs, no scripts)."""
    return render_page(
        "report.html.j2",
        title=f"Ablation report: {analysis.metric}",
        summary=list(summary_sections(analysis).items()),
        blocks=_blocks(analysis, figures, html_page=True),
    )


def _check_options(formats, confidence: float) -> set[str]:
    chosen = {formats} if isinstance(formats, str) else set(formats)
    unknown = chosen - set(FORMATS)
    if unknown:
        raise ReportInputError(
            f"unknown format {', '.join(sorted(unknown))}; choose from {','.join(FORMATS)}"
        )
    if not 0 < confidence < 1:
        raise ReportInputError(f"confidence {confidence} is not between 0 and 1; use e.g. 0.95")
    return chosen


TABLES = ("cells", "cumulative", "orderings", "shapley", "effects", "leave_one_out", "compute", "compute_matched")


def write_report(
    results: pd.DataFrame,
    factors: list[str],
    out_dir: str | Path,
    metric: str = "avg@32",
    orderings: str | list[list[str]] = "paper",
    formats=FORMATS,
    confidence: float = 0.95,
    curves: pd.DataFrame | None = None,
    design: str | None = None,
    echo: Callable[[str], None] | None = None,
    *,
    adjust: str = "holm",
    per_effect_tests: bool = False,
) -> dict[str, Path]:
    """Analyse ``results`` and write the report files into ``out_dir``; returns {file name: path}.

    Always claims.csv (the summary's "supported by the data" list, one row per sentence).
    Tables: cells, cumulative, orderings, shapley, effects, leave_one_out, compute and
    compute_matched, each as .csv / .md / .tex per ``formats``, and intervals.csv (every interval,
    its SE, df and method) with csv; figures shapley.png, gain_by_position.png, interactions.png
    and learning_curves.png (when ``curves`` is given and the data support them); report.md;
    report.html. ``design``: any | full | fraction-V | fraction (see ``design.require_design``);
    ``adjust`` and ``per_effect_tests``: see ``analysis.analyze``. A ``setting`` column naming two
    or more settings makes it a transfer study (``transfer_report.write_transfer_report``). Raises ReportInputError before
    writing anything when the input cannot be used. ``echo`` (e.g. ``print``) receives the
    plain-language summary.
    """
    chosen = _check_options(formats, confidence)
    factors = list(factors)
    if "setting" in results.columns and results["setting"].astype(str).nunique(dropna=False) > 1:
        from .transfer_report import write_transfer_report  # a transfer study: one block per setting

        return write_transfer_report(
            results, factors, Path(out_dir), chosen, metric=metric, orderings=orderings, confidence=confidence,
            design=design, adjust=adjust, per_effect_tests=per_effect_tests, echo=echo,
        )  # fmt: skip
    if curves is not None:
        curves = validate_curves(curves, factors, metric)
    analysis = analyze(
        results, factors, metric, orderings, confidence, design,
        adjust=adjust, per_effect_tests=per_effect_tests, curves=curves,
    )  # fmt: skip
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    written: dict[str, Path] = {"claims.csv": out / "claims.csv"}
    analysis.claims[CLAIM_COLUMNS].to_csv(written["claims.csv"], index=False)
    captions = _captions(analysis)
    for name in TABLES:
        display = _cumulative_display(analysis) if name == "cumulative" else None
        table = getattr(analysis, name)
        written |= write_table(name, table, out, chosen, captions[name], analysis.percent, factors, display)
    if "csv" in chosen:
        written["intervals.csv"] = out / "intervals.csv"
        analysis.intervals.to_csv(written["intervals.csv"], index=False)
    figures = _figures(analysis, curves) if chosen & {"png", "html"} else {}
    if "png" in chosen:
        for name, png in figures.items():
            written[name] = out / name
            written[name].write_bytes(png)
    if "md" in chosen:
        written["report.md"] = out / "report.md"
        written["report.md"].write_text(report_markdown(analysis, list(figures) if "png" in chosen else []))
    if "html" in chosen:
        written["report.html"] = out / "report.html"
        written["report.html"].write_text(report_html(analysis, figures))
    if echo is not None:
        echo_summary(analysis, echo)
    return written


def echo_summary(analysis: Analysis, echo: Callable[[str], None]) -> None:
    """The plain-language summary, one line per call of ``echo``."""
    for heading, lines in summary_sections(analysis).items():
        echo(f"{heading}:")
        for line in lines:
            echo(f"  - {line}")
        if not lines:
            echo(f"  {EMPTY_SUPPORTED}")
