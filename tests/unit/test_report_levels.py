"""A report says what each factor's 0 and 1 stand for when the experiment's spec is known: a
technique off / on, a knob's two values (core/contracts.py: FactorInfo)."""

from __future__ import annotations

from pathlib import Path

from dapo_ablate.reports import ReportOptions, write_report
from dapo_ablate.reports.simulate import simulate_results


def test_a_results_csv_without_levels_says_nothing_about_them(tmp_path: Path):
    results = simulate_results(["clip_higher"], 0.30, {"clip_higher": 0.05}, seeds=2, rng=0)
    write_report(results, ["clip_higher"], tmp_path, options=ReportOptions(formats=("md",)))
    assert "Levels (0 / 1)" not in (tmp_path / "report.md").read_text()
