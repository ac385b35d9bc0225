"""The slower cases of tests/unit/test_claims.py (a report rendered in full): in this tree so the fast
tier stays near a minute."""

from __future__ import annotations

import html

import pandas as pd

from dapo_ablate.reports import write_report
from dapo_ablate.reports.claims import claim_sentence

from test_claims import FACTORS, planted  # noqa: F401, F811 - shared with the fast part


def test_summary_renders_exactly_the_claims(planted, tmp_path):
    write_report(planted, FACTORS, tmp_path, formats=["csv", "md", "html"])
    claims = pd.read_csv(tmp_path / "claims.csv")
    text = (tmp_path / "report.md").read_text()
    section = text.split("## Supported by the data")[1].split("## ")[0]
    bullets = [line[2:] for line in section.splitlines() if line.startswith("- ")]
    assert bullets == [claim_sentence(row, True) for row in claims.itertuples(index=False)]
    page = html.unescape((tmp_path / "report.html").read_text())
    assert all(sentence in page for sentence in bullets)
