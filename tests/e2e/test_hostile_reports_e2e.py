"""The slower cases of tests/unit/test_hostile_reports.py (a report's figures rendered with hostile
titles): in this tree so the fast tier stays near a minute."""

from __future__ import annotations

from dapo_ablate.reports import write_report
from dapo_ablate.reports.simulate import simulate_results


def test_a_figure_title_with_tex_math_does_not_break_the_report(tmp_path):
    names = ["$\\undefinedcommand{x}$", "b"]
    results = simulate_results(names, 0.5, {(names[0],): 0.05}, seeds=2, noise_sd=0.01)
    written = write_report(results, names, tmp_path, formats=["png"])
    assert "shapley.png" in written
