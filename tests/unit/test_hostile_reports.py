"""Hostile names in a results table (exports are inert): factor, setting and metric
names are user text, and every file a report writes keeps them inert. A CSV cell that a
spreadsheet would run as a formula is prefixed with a single quote (numbers stay numbers),
report.md escapes HTML and Markdown, a newline in a name does not split a table row, and the
LaTeX tables escape everything TeX would act on."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dapo_ablate.reports import export, write_report
from dapo_ablate.reports.simulate import simulate_results, simulate_settings

FORMULA = "=cmd|' /C calc'!A0"
SCRIPT = "<script>alert(1)</script>"
HOSTILE = [FORMULA, SCRIPT, "a|b `x` \\input{/etc/passwd}", "new\nline [x](http://e.invalid) ![i](http://e.invalid/p.png)"]
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory) -> Path:
    """A 2^4 report whose factor names are hostile, with a clearly negative effect (so the CSVs
    hold negative numbers) and the metric named like a formula."""
    results = simulate_results(HOSTILE, 0.5, {(FORMULA,): -0.08, (SCRIPT,): 0.05}, seeds=2, noise_sd=0.01, rng=0)
    results = results.rename(columns={"avg@32": "@avg"})
    out = tmp_path_factory.mktemp("hostile")
    write_report(results, HOSTILE, out, metric="@avg", formats=["csv", "md", "tex"])
    return out


def _cells(path: Path) -> list[str]:
    with path.open(newline="") as handle:
        return [cell for row in csv.reader(handle) for cell in row]


def _is_formula(cell: str) -> bool:
    return bool(cell) and cell[0] in FORMULA_PREFIXES and not NUMBER.match(cell)


def test_csv_cells_from_names_are_neutralised_and_numbers_stay_numbers(hostile_report):
    files = sorted(hostile_report.glob("*.csv"))
    assert len(files) >= 9
    for path in files:
        formulas = [cell for cell in _cells(path) if _is_formula(cell)]
        assert not formulas, f"{path.name}: {formulas[:3]}"
    effects = list(csv.DictReader((hostile_report / "effects.csv").open(newline="")))
    first = next(row for row in effects if row["term"] == "'" + FORMULA)
    assert float(first["effect"]) < -0.05  # a negative estimate is written as a number, not neutralised
    cells = list(csv.DictReader((hostile_report / "cells.csv").open(newline="")))
    assert "'" + FORMULA in cells[0]  # the factor's column header, too
    assert all(float(row["mean"]) > 0 for row in cells)


def test_spreadsheet_safe_quotes_text_only():
    table = pd.DataFrame(
        {"name": ["=1+1", "+x", "-x", "@x", "\tx", "\rx", "-0.03", "fine", None], "value": [-0.03] * 9}
    )
    safe = export.spreadsheet_safe(table)
    assert list(safe["name"][:6]) == ["'=1+1", "'+x", "'-x", "'@x", "'\tx", "'\rx"]
    assert list(safe["name"][6:8]) == ["-0.03", "fine"] and pd.isna(safe["name"][8])
    assert safe["value"].dtype == np.float64 and (safe["value"] == -0.03).all()
    assert list(export.spreadsheet_safe(table.rename(columns={"name": "=x"})).columns) == ["'=x", "value"]


def test_report_md_escapes_html_and_markdown_from_names(hostile_report):
    text = (hostile_report / "report.md").read_text()
    assert "<script" not in text and "&lt;script>" in text
    assert not re.search(r"(?<!\\)\]\(", text)  # no link or image from a name: its "](" is escaped
    assert "`x`" not in text and "\\`x\\`" in text
    for path in [hostile_report / "report.md", *hostile_report.glob("*.md")]:
        _assert_tables_keep_their_columns(path.read_text(), path.name)


def _assert_tables_keep_their_columns(text: str, name: str) -> None:
    """Every Markdown table row has as many unescaped pipes as its header, and no row is split
    (a name's newline would start a line that is not a row)."""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        separator = lines[number + 1] if number + 1 < len(lines) else ""
        if line.startswith("|") and separator.startswith("|") and set(separator) <= set("|:- "):
            width = len(re.findall(r"(?<!\\)\|", line))
            rows = number + 2
            while rows < len(lines) and lines[rows].strip():
                assert len(re.findall(r"(?<!\\)\|", lines[rows])) == width, f"{name}: {lines[rows]!r}"
                rows += 1


def test_markdown_text_examples():
    assert export.markdown_text("a|b") == "a\\|b"
    assert export.markdown_text("$x^2$") == "\\$x^2\\$"  # GitHub would typeset it as math
    assert export.markdown_text("x\ny\r\nz") == "x y z"
    assert export.markdown_text("<b>&amp;") == "&lt;b>&amp;amp;"
    assert export.markdown_text("p < 0.05, <0.001") == "p < 0.05, <0.001"  # no tag can start there: unchanged
    assert export.markdown_text("clip_higher") == "clip_higher"  # intraword: no emphasis in CommonMark
    assert export.markdown_text("_x_ *y* [l](u) ![i][r] [r]: u # h") == "\\_x\\_ \\*y\\* [l\\](u) ![i\\][r] [r\\]: u \\# h"
    assert export.markdown_text("[-2.6, 2.5] (p = 0.1)") == "[-2.6, 2.5] (p = 0.1)"  # an interval is no link


def test_latex_tables_keep_names_inert(hostile_report):
    for path in hostile_report.glob("*.tex"):
        text = path.read_text()
        assert "\\input{" not in text and "<script" not in text, path.name
    assert export.latex_escape("new\nline\r\n") == "new line "
    assert export.latex_escape("\\input{x}") == r"\textbackslash{}input\{x\}"


def test_transfer_report_neutralises_setting_names(tmp_path):
    results = simulate_settings(["a", "b"], 0.5, {FORMULA: {("a",): 0.05}, "@sum(1)": {("a",): -0.05}}, seeds=2)
    write_report(results, ["a", "b"], tmp_path, formats=["csv", "md"])
    for path in tmp_path.glob("*.csv"):
        formulas = [cell for cell in _cells(path) if _is_formula(cell)]
        assert not formulas, f"{path.name}: {formulas[:3]}"
    text = (tmp_path / "report.md").read_text()
    assert "'" + FORMULA not in text  # the quote is for spreadsheets only
    _assert_tables_keep_their_columns(text, "report.md")
