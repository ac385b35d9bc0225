"""Published technique effects: the package's data file (directions, settings, citations) and the
report section that sets the experiment's estimates beside those whose setting matches."""

from __future__ import annotations

import re

import pandas as pd

from dapo_ablate.core.contracts import SettingInfo
from dapo_ablate.reports import write_report
from dapo_ablate.reports.published import DATA, PUBLISHED_COLUMNS, published_effects
from dapo_ablate.reports.simulate import simulate_results

SOURCES = {"2503.14476", "2508.08221", "2510.13786", "2512.16649", "2504.11343"}
FACTORS = ["overlong_filter", "clip_higher", "dynamic_sampling"]
PAPER_SETTING = SettingInfo("paper", "Qwen2.5", "32B", "base", "dapo-math-17k", 20480)


def test_the_data_file_ships_with_the_package_and_cites_each_entry():
    assert DATA.is_file() and DATA.parent.parent.name == "reports"
    entries = published_effects()
    assert len(entries) >= 10
    for entry in entries:
        assert set(re.findall(r"arXiv (\d{4}\.\d{5})", entry["citation"])) <= SOURCES
        assert "arXiv" in entry["citation"]
        assert "interval" not in entry and "estimate" not in entry  # directions only: no source gives an interval


def test_matching_entries_are_set_beside_the_estimates(tmp_path):
    # DS helps, CH hurts here; the DAPO table says both help in this setting
    results = simulate_results(FACTORS, 0.4, {("dynamic_sampling",): 0.08, ("clip_higher",): -0.06}, seeds=3,
                               noise_sd=0.01, rng=5)
    out = tmp_path / "report"
    write_report(results, FACTORS, out, formats=["csv", "md"], settings=(PAPER_SETTING,))
    table = pd.read_csv(out / "published.csv")
    assert list(table.columns) == PUBLISHED_COLUMNS
    dapo = table[table["source"] == "DAPO"].set_index("technique")["verdict"]
    assert dapo.to_dict() == {"overlong_filter": "inconclusive", "clip_higher": "disagree", "dynamic_sampling": "agree"}
    assert set(table["source"]) == {"DAPO", "verl DAPO recipe"}  # the other sources name other models
    page = (out / "report.md").read_text()
    section = page.split("## Published effects")[1].split("## ")[0]
    assert section.count("- In paper:") == len(table)
    for row in table.itertuples(index=False):
        assert f": {row.verdict}." in section


def test_no_match_says_so_and_writes_a_header_only_table(tmp_path):
    results = simulate_results(FACTORS, 0.4, {}, seeds=2, noise_sd=0.01, rng=6)
    out = tmp_path / "report"
    write_report(results, FACTORS, out, formats=["md"], settings=(SettingInfo("quick", "builtin", "small"),))
    assert pd.read_csv(out / "published.csv").empty
    assert "No published direction in the package's list" in (out / "report.md").read_text()
