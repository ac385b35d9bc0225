"""The slower cases of tests/unit/test_report_levels.py (a report rendered in full): in this tree so
the fast tier stays near a minute."""

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
