"""What report.md / report.html and the transfer report's pages share: the tables' names and
captions, the cumulative table as shown (the paper's numbers beside it), figure views, and the
Jinja2 templates (``reports/templates``) the pages render from."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pandas as pd

from .analysis import Analysis
from .export import markdown_text
from .summary import EMPTY_SUPPORTED

TABLES = (
    "cells", "cumulative", "orderings", "shapley", "effects", "leave_one_out", "compute", "compute_matched", "compute_curves",
)  # fmt: skip
"""The tables every report writes (one file per format each), in file order."""


def table_captions(analysis: Analysis) -> dict[str, str]:
    """Each table's caption (Markdown, LaTeX and the pages), by table name."""
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
        "cells": f"Cells ranked by mean (rank 1: the highest): runs, mean (for these seeds: seed-adjusted when a cell lacks a "
        f"seed the others ran), sd over seeds, {conf} of {analysis.metric}{unit}; seed_ci: the {conf} over new seeds.",
        "compute_curves": f"Compute curves: each technique's effect on the asymptote A of the fitted saturating curve, "
        f"the ceiling{unit}, on the compute to reach half the gain (midpoint_ratio: with / without the technique, "
        f"below 1 is faster), with {conf}s and Holm-adjusted p-values over both curve parameters, and the final "
        f"{analysis.metric}{unit} (the main effect of the effects table, the same interval); verdict: moves the ceiling, "
        "only the speed, both, neither (no evidence of a change), or not enough data (no interval, an interval that says "
        "nothing, or curves that have not bent within the compute observed). Asymptotes and midpoints beyond the compute "
        "observed are extrapolations (predicted, not observed).",
        "looks": "One row per look and term: the runs so far, the alpha spent, the term's estimate with its repeated "
        f"{conf} (valid over all looks together){unit} and the decision the look made (the experiment's claims are "
        "the last look's supported terms).",
        "cumulative": f"Cumulative tables: each step adds one factor to the row above; delta is the gain over it, with {conf}.{paper}",
        "orderings": "Order dependence: each factor's gain by the position at which an ordering adds it, and over all orderings (mean with "
        f"{conf}, min, max, share of orderings in which it helps). comparisons: the distinct cell pairs (with and without the "
        f"factor) behind a row; positions 1 and {len(analysis.factors)} are one comparison each (onto the baseline; onto all "
        "the others), shared by many orderings, so min and max are left empty there. orderings.csv keeps n_orderings.",
        "shapley": f"Shapley values (mean gain over all orderings) and Banzhaf values (mean over edges = main effect), {conf}{unit}.",
        "effects": f"Factorial effects (-1/+1 coding, effect = 2 x OLS coefficient): main effects and two-factor interactions "
        f"(aliased terms named as their whole chain), {conf}{unit}, "
        + ("Lenth's df (one run per cell)" if analysis.lenth is not None else "each effect's Welch-Satterthwaite df")
        + ", raw and family-adjusted p-values.",
        "leave_one_out": f"Leave-one-out (full minus full without the factor) and add-one (baseline plus the factor minus baseline), {conf}{unit}.",
        "compute": "Compute per cell (means over seeds): tokens generated include those discarded by dynamic sampling; "
        f"gain is over the baseline{unit}; gain_per_added_mtok divides it by the million tokens the cell generated "
        "beyond the baseline (empty where it adds none); mean_at_budget (when shown) is the mean at the equal-compute budget "
        "over the cell's runs_at_budget runs (a run whose curve starts past the budget is not reached and not counted).",
        "compute_matched": "Equal compute: each effect at equal training steps (effect, CI) beside the same effect with every run "
        "read at one generated-token budget (budget_tokens), interpolated linearly between its evaluations"
        f"{unit}. Empty when the results carry no evaluation curves with token counts.",
    }


def cumulative_display(analysis: Analysis, limit: int | None = None) -> pd.DataFrame:
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


@dataclass(frozen=True)
class FigureView:
    """A figure as a page shows it: its file name and, on an HTML page, its PNG as base64."""

    name: str
    caption: str
    base64: str = ""


TEMPLATES = Path(__file__).with_name("templates")


@functools.cache
def _environment() -> jinja2.Environment:
    """The report pages' templates; HTML templates autoescape, Markdown ones put their text
    through the ``md`` filter (``export.markdown_text``)."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["md"] = markdown_text
    return environment


def render_page(template: str, **context) -> str:
    """Render ``reports/templates/<template>`` (ending in exactly one newline); every page also
    gets ``empty_supported`` (EMPTY_SUPPORTED unless the context gives its own)."""
    page = _environment().get_template(template).render(**{"empty_supported": EMPTY_SUPPORTED, **context})
    return page.rstrip("\n") + "\n"
