"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_reports_export.py
describes; its docstring says what they check."""

from __future__ import annotations

from test_reports_export import FACTORS, FIGURES, PLANTED, TABLES, report_dir  # noqa: F401, F811 - shared with the fast part


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
