"""A report says what each factor's 0 and 1 stand for when the experiment's spec is known: a
technique off / on, a knob's two values (core/contracts.py: FactorInfo)."""

from __future__ import annotations

from pathlib import Path

from dapo_ablate.core.contracts import FactorInfo
from dapo_ablate.reports import ReportOptions, write_report
from dapo_ablate.reports.simulate import simulate_results


def test_the_report_names_each_factors_levels(tmp_path: Path):
    factors = ["clip_higher", "eps_low"]
    results = simulate_results(factors, 0.30, {"clip_higher": 0.05}, seeds=2, rng=0)
    levels = (FactorInfo.technique("clip_higher"), FactorInfo("eps_low", 0.2, 0.28))
    write_report(results, factors, tmp_path, options=ReportOptions(formats=("md", "html"), levels=levels))
    for page in ("report.md", "report.html"):
        text = (tmp_path / page).read_text()
        assert "Levels (0 / 1)" in text and "CH off / on" in text and "eps" in text and "0.2 / 0.28" in text


def test_a_results_csv_without_levels_says_nothing_about_them(tmp_path: Path):
    results = simulate_results(["clip_higher"], 0.30, {"clip_higher": 0.05}, seeds=2, rng=0)
    write_report(results, ["clip_higher"], tmp_path, options=ReportOptions(formats=("md",)))
    assert "Levels (0 / 1)" not in (tmp_path / "report.md").read_text()
