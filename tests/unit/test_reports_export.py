"""Report files: every table in CSV/Markdown/LaTeX, figures, report.md and a self-contained report.html.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_reports_export_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dapo_ablate.reports import PAPER_FACTORS, write_report
from dapo_ablate.reports.simulate import simulate_results

FACTORS = list(PAPER_FACTORS)

PLANTED = {
    ("overlong_filter",): 0.06,
    ("dynamic_sampling",): 0.08,
    ("clip_higher", "dynamic_sampling"): 0.03,
    ("overlong_filter", "clip_higher", "dynamic_sampling"): 0.04,
}

TABLES = [
    "cells", "cumulative", "orderings", "shapley", "effects", "leave_one_out", "compute", "compute_matched", "compute_curves",
]  # fmt: skip

ALWAYS = {"claims.csv", "units.csv", "predictions.yaml", "settings.csv", "published.csv"}

FIGURES = [
    "cumulative.png", "shapley.png", "gain_by_position.png", "effects.png", "interactions.png", "learning_curves.png",
    "learning_curves_overlay.png", "compute_curves.png",
]  # signals.png needs training signals: tests/unit/test_report_figures.py

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=3, noise_sd=0.01, rng=0)
    curves = pd.concat(
        [
            results.assign(
                step=step,
                **{"avg@32": results["avg@32"] * step / 4, "tokens_generated": results["tokens_generated"] * step / 4},
            )
            for step in range(5)
        ]
    )
    out = tmp_path_factory.mktemp("report")
    written = write_report(results, FACTORS, out, curves=curves)
    assert set(written) == {f"{t}.{ext}" for t in TABLES for ext in ("csv", "md", "tex")} | set(FIGURES) | {
        "report.md",
        "report.html",
        "intervals.csv",
    } | ALWAYS
    return out


def test_formats_limit_what_is_written(tmp_path):
    results = simulate_results(["a", "b"], 0.3, {("a",): 0.1}, seeds=2, rng=1)
    written = write_report(results, ["a", "b"], tmp_path, formats=["csv"])
    assert set(written) == {f"{t}.csv" for t in TABLES} | ALWAYS | {"intervals.csv"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)


def test_incomplete_design_report_says_what_it_lacks(tmp_path):
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, cells=[0, 1, 3, 7, 15, 31], rng=2)
    written = write_report(results, FACTORS, tmp_path)
    assert "shapley.png" not in written and "gain_by_position.png" not in written
    text = (tmp_path / "report.md").read_text()
    assert "Incomplete design: 6 of 32 cells" in text and "not computed" in text
