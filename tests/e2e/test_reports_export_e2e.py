"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_reports_export.py
describes; its docstring says what they check."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest

from dapo_ablate.reports.export import latex_escape

from support import HANG_GUARD_S
from test_reports_export import CHROMIUM, FACTORS, FIGURES, PLANTED, TABLES, report_dir  # noqa: F401, F811 - shared with the fast part


def test_every_file_is_written(report_dir):
    for name in [
        *(f"{t}.{ext}" for t in TABLES for ext in ("csv", "md", "tex")),
        *FIGURES,
        "report.md",
        "report.html",
        "claims.csv",
        "intervals.csv",
    ]:
        assert (report_dir / name).stat().st_size > 0, name
    for figure in FIGURES:
        assert (report_dir / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_csv_columns_follow_the_contract(report_dir):
    read = lambda name: pd.read_csv(report_dir / f"{name}.csv")  # noqa: E731
    assert list(read("cumulative").columns) == [
        "ordering",
        "step",
        "added",
        "mean",
        "ci_low",
        "ci_high",
        "delta",
        "delta_ci_low",
        "delta_ci_high",
        "observed",  # False: the cell was not run, its mean is the fitted model's prediction
    ]
    assert list(read("shapley").columns) == [
        "factor",
        "shapley",
        "ci_low",
        "ci_high",
        "banzhaf",
        "banzhaf_ci_low",
        "banzhaf_ci_high",
    ]
    assert list(read("effects").columns) == [
        "term", "effect", "se", "ci_low", "ci_high", "p_value", "df", "p_adjusted",
    ]  # fmt: skip
    assert list(read("claims").columns) == [
        "kind", "term", "estimate", "ci_low", "ci_high", "p_value", "p_adjusted", "family",
    ]  # fmt: skip
    assert set(read("effects")["term"]) >= {"overlong_filter", "clip_higher:dynamic_sampling"}
    cumulative = read("cumulative")
    assert cumulative.loc[0, "ordering"] == "paper" and cumulative.loc[0, "step"] == 0
    assert cumulative["mean"].between(0, 1).all()  # stored as fractions


def test_markdown_shows_percentage_points_and_the_paper(report_dir):
    text = (report_dir / "cumulative.md").read_text()
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    header = rows[0]
    assert header[0] == "ordering" and header[header.index("mean (pp)") + 1] == "paper (pp)"  # the unit in the header
    first_row = next(row for row in rows if row[:2] == ["paper", "0"])
    assert first_row[2] == "baseline" and re.fullmatch(r"3\d\.\d", first_row[3]) and first_row[4] == "30"


def test_units_csv_names_every_csv_columns_unit(report_dir):
    units = pd.read_csv(report_dir / "units.csv", keep_default_na=False)
    unit = {(row.file, row.column): row.unit for row in units.itertuples(index=False)}
    assert unit["cells.csv", "mean"] == unit["claims.csv", "estimate"] == unit["effects.csv", "ci_low"] == "fraction (x100 = pp)"
    assert unit["cells.csv", "n"] == "count" and unit["cells.csv", "overlong_filter"] == "level (0 off, 1 on)"
    assert unit["effects.csv", "p_adjusted"] == "p-value" and unit["compute.csv", "tokens_generated"] == "tokens"
    assert unit["cells.csv", "cell"] == ""  # text
    for name in {row.file for row in units.itertuples(index=False)}:  # every column of every CSV, in order
        assert list(pd.read_csv(report_dir / name).columns) == list(units.loc[units["file"] == name, "column"])


def test_cells_are_ranked_by_mean_with_their_intervals(report_dir):
    cells = pd.read_csv(report_dir / "cells.csv")
    assert sorted(cells["rank"]) == list(range(1, 33)) and cells.loc[cells["mean"].idxmax(), "rank"] == 1
    text = (report_dir / "cells.md").read_text()
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    header, body = rows[0], rows[2:]
    assert {"mean (pp)", "ci_low (pp)", "ci_high (pp)", "rank"} <= set(header)
    means = [float(row[header.index("mean (pp)")]) for row in body]
    assert means == sorted(means, reverse=True) and [row[header.index("rank")] for row in body[:2]] == ["1", "2"]
    assert "## Cells ranked by mean" in (report_dir / "report.md").read_text()


def test_compute_curves_table_and_section(report_dir):
    from dapo_ablate.reports.compute_curves import CURVE_EFFECT_COLUMNS

    table = pd.read_csv(report_dir / "compute_curves.csv")
    assert list(table.columns) == CURVE_EFFECT_COLUMNS and list(table["term"]) == FACTORS
    assert table["asymptote_ci_low"].notna().all()  # 5 evaluations per run: every run fitted
    md = (report_dir / "report.md").read_text()
    section = md[md.index("## Compute curves"):md.index("## Cells ranked by mean")]
    header = next(line for line in section.splitlines() if line.startswith("| term"))
    assert [c.strip() for c in header.strip("|").split("|")][:9] == [
        "term", "asymptote_effect (pp)", "asymptote_ci_low (pp)", "asymptote_ci_high (pp)", "asymptote_p_adjusted",
        "midpoint_ratio", "midpoint_ratio_ci_low", "midpoint_ratio_ci_high", "midpoint_p_adjusted",
    ]  # fmt: skip
    assert "![compute_curves.png]" in section
    assert "one steepness for all runs" in section  # how they were fitted, under the table
    # these curves climb linearly to the end: no ceiling within the data, and the page says so
    assert "put the asymptote outside 0-100 pp" in section and "extrapolations" in section


def test_latex_tables_use_booktabs_and_escape(report_dir):
    text = (report_dir / "shapley.tex").read_text()
    for command in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}"):
        assert command in text
    assert r"overlong\_filter" in text
    assert latex_escape("a_b & 50%") == r"a\_b \& 50\%"


def test_report_md_has_the_summary_and_links_figures(report_dir):
    text = (report_dir / "report.md").read_text()
    assert "## Supported by the data" in text and "## Not supported by the data" in text
    assert "check passed" in text
    for figure in FIGURES:
        assert f"]({figure})" in text


def test_report_html_is_self_contained(report_dir):
    text = (report_dir / "report.html").read_text()
    assert text.count('src="data:image/png;base64,') == len(FIGURES)
    assert not re.search(r"(src|href)=\"(?!data:)", text)  # nothing loaded from elsewhere
    assert "<script" not in text


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
)
def test_report_html_loads_in_headless_chromium(report_dir, tmp_path):
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    url = (report_dir / "report.html").as_uri()
    dom = subprocess.run(
        [str(CHROMIUM), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Supported by the data" in dom.stdout and dom.stdout.count("<img") == len(FIGURES)
    shot = tmp_path / "report.png"
    run = subprocess.run(
        [str(CHROMIUM), *flags, f"--screenshot={shot}", "--window-size=1280,2000", url],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0 and shot.stat().st_size > 10_000, run.stderr[-2000:]
