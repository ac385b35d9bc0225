"""Tables as CSV, Markdown, LaTeX (booktabs) and HTML, written by pandas; and display formatting.

CSV files store values as computed (accuracy as fractions in [0, 1]); units.csv says each
column's unit (the column names are a contract and stay as they are). Markdown, LaTeX and HTML show metric-valued columns in percentage points when the metric
is a fraction, like the paper, with the unit in the header ("mean (pp)").
The writers are pandas' own (``DataFrame.to_markdown`` through tabulate, ``Styler.to_latex`` with
booktabs rules, ``Styler.to_html``); this module only decides how each column's values read
(``column_formatter``), which columns are text (left-aligned) or numbers (right-aligned), and
how text is escaped.

Names in these files are user text (factor, setting and metric names, and the cell labels and
terms built from them), so every writer keeps them inert: CSV cells that a spreadsheet would
run as a formula are quoted (``spreadsheet_safe``), Markdown escapes HTML and its own syntax
(``markdown_text``), LaTeX escapes every character TeX acts on (``latex_escape``), and HTML is
escaped by Styler and the templates' autoescape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pandas.io.formats.style import Styler

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
    "sim_ci_low",
    "sim_ci_high",
    "gap_ci_low",
    "gap_ci_high",
    "detectable_difference",
    "excluded_beyond",
    "asymptote_effect",
    "asymptote_ci_low",
    "asymptote_ci_high",
    "final_effect",
    "final_ci_low",
    "final_ci_high",
}
SHARE_COLUMNS = {"share_positive", "discarded_share"}
COUNT_COLUMNS = {"n", "step", "n_orderings", "paper", "runs_at_budget", "rank", "look", "runs"}
TOKEN_COLUMNS = {"tokens_generated", "tokens_discarded", "budget_tokens"}
P_VALUE_COLUMNS = {"p_value", "p_adjusted", "p_interaction", "p_flip_adjusted", "asymptote_p_adjusted", "midpoint_p_adjusted"}
RATIO_COLUMNS = {"tokens_vs_baseline", "midpoint_ratio", "midpoint_ratio_ci_low", "midpoint_ratio_ci_high"}
PP = "pp"
"""The unit of metric-valued columns on every page, figure and table a person reads, when the
metric is a fraction; the CSVs keep fractions and units.csv says so (``units_table``)."""


def _p_value(p: float) -> str:
    """Three decimals, and "<0.001" below that (more digits would claim a precision the tests lack)."""
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _degrees_of_freedom(df: float) -> str:
    """Whole for classical t tests, one decimal for Satterthwaite's fractional df."""
    return f"{df:.0f}" if float(df).is_integer() else f"{df:.1f}"


def _fallback(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def column_formatter(column: str, percent: bool, factors: set[str]) -> Callable[[object], str]:
    """How the values of ``column`` read in Markdown, LaTeX and HTML (missing values are left to
    the caller): metrics in percentage points with one decimal when ``percent`` (like the paper),
    else 4 significant digits; shares as whole percents; counts and factor levels as integers;
    p-values to 3 decimals; tokens in millions; compute ratios with an "x"."""
    if column in METRIC_COLUMNS:
        return (lambda value: f"{100 * value:.1f}") if percent else "{:.4g}".format
    if column in SHARE_COLUMNS:
        return "{:.0%}".format
    if column in COUNT_COLUMNS or column in factors:
        return "{:.0f}".format
    if column == "df":
        return _degrees_of_freedom
    if column in P_VALUE_COLUMNS:
        return _p_value
    if column in TOKEN_COLUMNS:
        return lambda value: f"{value / 1e6:.2f}M"
    if column in RATIO_COLUMNS:
        return "{:.2f}x".format
    if column == "wall_s":
        return "{:.0f}".format
    return _fallback


def display_frame(table: pd.DataFrame, percent: bool, factors: list[str]) -> pd.DataFrame:
    """All cells formatted as strings (see ``column_formatter``); missing values become "". The
    headers of metric-valued columns name their unit ("mean (pp)") when ``percent``; the columns
    stay in ``table``'s order (the writers align them by position)."""
    factor_set = set(factors)
    shown = {
        column: table[column].map(column_formatter(column, percent, factor_set), na_action="ignore")
        for column in table.columns
    }
    frame = pd.DataFrame(shown, columns=table.columns).fillna("").astype(str).reset_index(drop=True)
    return frame.set_axis([unit_header(column, percent) for column in table.columns], axis=1)


def unit_header(column, percent: bool) -> str:
    """``column``'s header on a page: "mean (pp)" for a metric-valued column of a fraction metric."""
    return f"{column} ({PP})" if percent and (column in METRIC_COLUMNS or column == "paper") else str(column)


def column_unit(column: str, percent: bool, factors: set[str]) -> str:
    """How ``column``'s values are stored in a CSV (units.csv): metric values as fractions of 1
    (x100 = pp) when ``percent``, shares as fractions, counts, tokens, p-values, seconds..."""
    kinds = (
        (METRIC_COLUMNS, "fraction (x100 = pp)" if percent else "metric units"),
        (SHARE_COLUMNS, "fraction (x100 = %)"),
        (COUNT_COLUMNS, "count"),
        (TOKEN_COLUMNS, "tokens"),
        (P_VALUE_COLUMNS, "p-value"),
        (RATIO_COLUMNS, "ratio"),
        (factors, "level (0 off, 1 on)"),
        ({"df"}, "degrees of freedom"),
        ({"wall_s", "setup_s", "initial_eval_s"}, "seconds"),
    )
    return next((unit for names, unit in kinds if column in names), "")


def units_table(
    tables: dict[str, pd.DataFrame], percent: bool, factors: list[str], like: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """units.csv: one row per (file, column) of the report's CSVs with the column's unit (empty for
    text and for numbers without one). The CSVs' column names are a contract, so the unit is said
    here, not in the names. ``like``: columns of other tables (a sweep's) mapped to the column
    named here whose unit they share (``{"avg@32": "mean"}``; "" for no unit)."""
    factor_set, like = set(factors), like or {}
    rows = [{"file": file, "column": str(c), "unit": column_unit(like.get(str(c), str(c)), percent, factor_set)}
            for file, table in tables.items() for c in table.columns]  # fmt: skip
    return pd.DataFrame(rows, columns=["file", "column", "unit"])


def is_text_column(table: pd.DataFrame, column: str) -> bool:
    """Strings (cell labels, factor names, orderings) are left-aligned; numbers right-aligned."""
    values = table[column]
    is_text = pd.api.types.is_string_dtype(values) or pd.api.types.is_object_dtype(values)
    return is_text and column not in METRIC_COLUMNS and column != "position"


LINE_BREAKS = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")
"""Everything a reader or renderer may take as the end of a line."""
MARKDOWN_SPECIALS = re.compile(
    r"[\\`*|#~$]"  # escapes, code spans, emphasis, table cells, headings, strikethrough, math ($x$ on GitHub)
    r"|\](?=[(\[:])"  # links, images, references and their definitions ("[-2.6, 2.5]" stays as it is)
    r"|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])"  # "_" opens or closes emphasis only at a word's edge
)
HTML_OPENERS = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)")
"""A "<" that could start a tag, comment or autolink, an "&" that would read as an entity."""


def markdown_text(text) -> str:
    """``text`` as Markdown shows it literally, on one line: line breaks become spaces (a name's
    newline would end a table row or a list item), Markdown's syntax characters are
    backslash-escaped, and "<" / "&" where they could start HTML become entities. Text that
    renders as itself is left as it is ("p < 0.05", "clip_higher", "GRPO -> OF").

    Example: ``a|b <script>`` -> ``a\\|b &lt;script>``."""
    text = LINE_BREAKS.sub(" ", str(text))
    text = HTML_OPENERS.sub(lambda match: "&lt;" if match.group() == "<" else "&amp;", text)
    return MARKDOWN_SPECIALS.sub(lambda match: "\\" + match.group(), text)


def to_markdown(table: pd.DataFrame, shown: pd.DataFrame) -> str:
    """GitHub Markdown (pipe) table of the formatted ``shown``; text columns left, numbers right;
    every cell and header through ``markdown_text`` (tabulate writes cells as they are).

    ``disable_numparse``: the cells are already formatted ("36.0", "<0.001"); left to itself
    tabulate would parse and re-format them ("36.0" -> "36")."""
    return markdown_table(shown, [not is_text_column(table, c) for c in table.columns])


def markdown_table(shown: pd.DataFrame, numeric: Sequence[bool]) -> str:
    """``to_markdown`` of text cells already formatted, column i right-aligned where ``numeric[i]``."""
    align = tuple("right" if number else "left" for number in numeric)
    escaped = shown.map(markdown_text).rename(columns=markdown_text)
    return escaped.to_markdown(index=False, tablefmt="pipe", colalign=align, disable_numparse=True) + "\n"


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
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}


def latex_escape(text) -> str:
    """Text as LaTeX prints it literally. Used for cells, headers and the caption alike:
    Styler's own ``escape="latex"`` leaves ``<`` and ``>``, which LaTeX's default (OT1) fonts
    print as "¡" and "¿" (p-values "<0.001", path labels "GRPO -> OF"), and it never escapes
    the caption. Line breaks become spaces: two in a row would end the paragraph inside a cell."""
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in LINE_BREAKS.sub(" ", str(text)))


def to_latex(table: pd.DataFrame, shown: pd.DataFrame, caption: str, label: str | None = None) -> str:
    """A booktabs ``tabular`` (\\toprule, \\midrule, \\bottomrule) in a ``table`` float with the
    caption (and ``\\label{label}`` when given); text columns left, numbers right."""
    spec = "".join("l" if is_text_column(table, c) else "r" for c in table.columns)
    styler = shown.style.hide(axis="index").format(latex_escape).format_index(latex_escape, axis=1)
    return styler.to_latex(
        column_format=spec,
        hrules=True,
        caption=latex_escape(caption),
        label=label,
        position="ht",
        position_float="centering",
    )


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet reads a cell starting with one of these as a formula (OWASP, "CSV injection")."""
PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def spreadsheet_cell(value):
    """A text ``value`` that a spreadsheet would run as a formula, prefixed with a single quote
    (``=cmd|' /C calc'!A0`` -> ``'=cmd|' /C calc'!A0``); a number, or text that is a plain
    number ("-0.03"), is left as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES) and not PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


def spreadsheet_safe(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with every text cell and column name through ``spreadsheet_cell``; numeric
    columns are untouched, so negative estimates stay numbers."""
    safe = table.rename(columns=spreadsheet_cell)
    for position in range(safe.shape[1]):
        column = safe.iloc[:, position]
        if pd.api.types.is_object_dtype(column) or pd.api.types.is_string_dtype(column):
            safe.isetitem(position, column.map(spreadsheet_cell))
    return safe


def write_csv(table: pd.DataFrame, path: Path) -> None:
    """``table`` as CSV at ``path`` (no index), its text cells made inert (``spreadsheet_safe``)."""
    spreadsheet_safe(table).to_csv(path, index=False)


def _table_id(shown: pd.DataFrame) -> str:
    """A stable HTML id from the table's content: the same report gives the same page, and two
    different tables on one page get different ids (Styler's default is random)."""
    return hashlib.sha1(shown.to_csv(index=False).encode()).hexdigest()[:10]


def to_html(table: pd.DataFrame, shown: pd.DataFrame) -> str:
    """An escaped HTML table; numeric cells get class "num" (right-aligned by the report's CSS)."""
    return html_table(shown, [not is_text_column(table, c) for c in table.columns])


def html_table(shown: pd.DataFrame, numeric: Sequence[bool]) -> str:
    """``to_html`` of text cells already formatted, the cells of column i of class "num" where ``numeric[i]``."""
    classes = pd.DataFrame([["num" if number else "" for number in numeric]] * len(shown), index=shown.index,
                           columns=shown.columns)  # fmt: skip
    styler = (
        Styler(shown, uuid=_table_id(shown), cell_ids=False)
        .hide(axis="index")
        .format(escape="html")
        .format_index(escape="html", axis=1)
        .set_td_classes(classes)
    )
    return styler.to_html()


@dataclass(frozen=True)
class TableFiles:
    """Where and how one report writes its tables: the folder, the formats, and how values read
    (metric columns in percentage points when ``percent``; the factor columns as 0/1 levels)."""

    out_dir: Path
    formats: frozenset[str]
    percent: bool
    factors: tuple[str, ...]


def write_table(
    name: str, table: pd.DataFrame, files: TableFiles, caption: str, display: pd.DataFrame | None = None
) -> dict[str, Path]:
    """``name.csv`` (raw values of ``table``, text made inert), ``name.md`` and ``name.tex``
    (formatted ``display``, default ``table``; it may add columns such as the paper's numbers; the
    LaTeX float is labelled ``tab:name``), as ``files.formats`` asks, into ``files.out_dir``."""
    display = table if display is None else display
    shown = display_frame(display, files.percent, list(files.factors))
    out_dir, formats, written = files.out_dir, files.formats, {}
    if "csv" in formats:
        written[f"{name}.csv"] = out_dir / f"{name}.csv"
        write_csv(table, written[f"{name}.csv"])
    if "md" in formats:
        written[f"{name}.md"] = out_dir / f"{name}.md"
        written[f"{name}.md"].write_text(f"{markdown_text(caption)}\n\n" + to_markdown(display, shown))
    if "tex" in formats:
        written[f"{name}.tex"] = out_dir / f"{name}.tex"
        written[f"{name}.tex"].write_text(to_latex(display, shown, caption, label=f"tab:{name}"))
    return written
