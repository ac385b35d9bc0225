"""Tables as CSV, Markdown and LaTeX (booktabs), and display formatting.

CSV files store values as computed (accuracy as fractions in [0, 1]). Markdown, LaTeX and HTML
show metric-valued columns in percentage points when the metric is a fraction, like the paper.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

METRIC_COLUMNS = {
    "mean",
    "sd",
    "ci_low",
    "ci_high",
    "delta",
    "delta_ci_low",
    "delta_ci_high",
    "shapley",
    "banzhaf",
    "banzhaf_ci_low",
    "banzhaf_ci_high",
    "effect",
    "se",
    "leave_one_out",
    "loo_ci_low",
    "loo_ci_high",
    "add_one",
    "add_one_ci_low",
    "add_one_ci_high",
    "min",
    "max",
    "gain",
    "gain_per_added_mtok",
    "estimate",
    "mean_at_budget",
    "effect_at_budget",
    "budget_ci_low",
    "budget_ci_high",
    "first",
    "last",
    "gap",
    "seed_ci_low",
    "seed_ci_high",
}
SHARE_COLUMNS = {"share_positive", "discarded_share"}
COUNT_COLUMNS = {"n", "step", "n_orderings", "paper"}
NUMERIC_ALIGN = "r"


def _is_missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def format_value(column: str, value, percent: bool, factors: set[str]) -> str:
    """One cell of a display table; "" marks a missing value."""
    if _is_missing(value):
        return ""
    if column in METRIC_COLUMNS:
        return f"{100 * value:.1f}" if percent else f"{value:.4g}"
    if column in SHARE_COLUMNS:
        return f"{100 * value:.0f}%"
    if column in COUNT_COLUMNS or column in factors:
        return f"{int(value)}"
    if column == "df":
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    if column in ("p_value", "p_adjusted"):
        return "<0.001" if value < 0.001 else f"{value:.3f}"
    if column in ("tokens_generated", "tokens_discarded", "budget_tokens"):
        return f"{value / 1e6:.2f}M"
    if column == "tokens_vs_baseline":
        return f"{value:.2f}x"
    if column == "wall_s":
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def display_frame(table: pd.DataFrame, percent: bool, factors: list[str]) -> pd.DataFrame:
    """All cells formatted as strings (see ``format_value``)."""
    factor_set = set(factors)
    return pd.DataFrame(
        {c: [format_value(c, v, percent, factor_set) for v in table[c]] for c in table.columns},
        columns=table.columns,
    )


def is_text_column(table: pd.DataFrame, column: str) -> bool:
    """Strings (cell labels, factor names, orderings) are left-aligned; numbers right-aligned."""
    values = table[column]
    is_text = pd.api.types.is_string_dtype(values) or pd.api.types.is_object_dtype(values)
    return is_text and column not in METRIC_COLUMNS and column != "position"


def to_markdown(table: pd.DataFrame, shown: pd.DataFrame) -> str:
    """GitHub Markdown table of the formatted ``shown``; text columns left, numbers right."""
    escape = lambda s: str(s).replace("|", r"\|")  # noqa: E731
    header = "| " + " | ".join(map(escape, shown.columns)) + " |"
    rule = "|" + "|".join(":---" if is_text_column(table, c) else "---:" for c in shown.columns) + "|"
    rows = ["| " + " | ".join(escape(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in str(text)).replace("<", r"\textless{}")


def to_latex(table: pd.DataFrame, shown: pd.DataFrame, caption: str) -> str:
    """A booktabs ``tabular`` (\\toprule, \\midrule, \\bottomrule) inside a table float."""
    spec = "".join("l" if is_text_column(table, c) else "r" for c in shown.columns)
    lines = [
        r"\begin{table}[ht]",
        r"\centering",
        rf"\caption{{{latex_escape(caption)}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(c) for c in shown.columns) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(latex_escape(v) for v in row) + r" \\" for row in shown.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def to_html(table: pd.DataFrame, shown: pd.DataFrame) -> str:
    """An escaped HTML table; numeric columns get class "num" (right-aligned by the report CSS)."""
    numeric = [not is_text_column(table, c) for c in shown.columns]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{html.escape(v)}</td>' if num else f"<td>{html.escape(v)}</td>"
            for v, num in zip(row, numeric)
        )
        + "</tr>"
        for row in shown.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_table(
    name: str,
    table: pd.DataFrame,
    out_dir: Path,
    formats: set[str],
    caption: str,
    percent: bool,
    factors: list[str],
    display: pd.DataFrame | None = None,
) -> dict[str, Path]:
    """``name.csv`` (raw values of ``table``), ``name.md`` and ``name.tex`` (formatted ``display``,
    default ``table``; it may add columns such as the paper's numbers), as requested."""
    display = table if display is None else display
    shown = display_frame(display, percent, factors)
    written = {}
    if "csv" in formats:
        written[f"{name}.csv"] = out_dir / f"{name}.csv"
        table.to_csv(written[f"{name}.csv"], index=False)
    if "md" in formats:
        written[f"{name}.md"] = out_dir / f"{name}.md"
        written[f"{name}.md"].write_text(f"{caption}\n\n" + to_markdown(display, shown))
    if "tex" in formats:
        written[f"{name}.tex"] = out_dir / f"{name}.tex"
        written[f"{name}.tex"].write_text(to_latex(display, shown, caption))
    return written
