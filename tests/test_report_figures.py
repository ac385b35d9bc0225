"""Report pages (Jinja2 templates) and the report's figures, on simulated factorials."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
import pytest

from dapo_ablate.reports import PAPER_FACTORS, analyze, write_report
from dapo_ablate.reports.report import TEMPLATES, _report_tables
from dapo_ablate.reports.simulate import simulate_results
from dapo_ablate.reports.summary import summary_sections

FACTORS = list(PAPER_FACTORS)
PLANTED = {
    ("overlong_filter",): 0.06,
    ("dynamic_sampling",): 0.08,
    ("clip_higher", "dynamic_sampling"): 0.03,
}


def _curves(results: pd.DataFrame) -> pd.DataFrame:
    """Evaluation curves that climb linearly to each run's final value over 4 steps."""
    return pd.concat(
        [
            results.assign(
                step=step,
                **{"avg@32": results["avg@32"] * step / 4, "tokens_generated": results["tokens_generated"] * step / 4},
            )
            for step in range(5)
        ]
    )


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return simulate_results(FACTORS, 0.30, PLANTED, seeds=2, noise_sd=0.01, rng=0)


@pytest.fixture(scope="module")
def report_dir(results, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    write_report(results, FACTORS, out, curves=_curves(results))
    return out


def markdown_sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section of a Markdown page, bodies whitespace-normalised."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)[1:]
    return [(parts[i].strip(), " ".join(parts[i + 1].split())) for i in range(0, len(parts), 2)]


def html_sections(text: str) -> list[tuple[str, str]]:
    """(heading, visible text) of each ``<h2>`` section of an HTML page."""
    parts = re.split(r"<h2>(.*?)</h2>", text, flags=re.S)[1:]
    visible = lambda part: " ".join(html.unescape(re.sub(r"<[^>]+>", " ", part)).split())  # noqa: E731
    return [(html.unescape(parts[i]), visible(parts[i + 1])) for i in range(0, len(parts), 2)]


def test_templates_ship_inside_the_package():
    names = {path.name for path in TEMPLATES.iterdir()}
    assert {"report.md.j2", "report.html.j2", "transfer.md.j2", "transfer.html.j2"} <= names


def test_markdown_and_html_pages_show_the_same_sections(results, report_dir):
    analysis = analyze(results, FACTORS)
    expected = [*summary_sections(analysis), *(title for title, _, _ in _report_tables(analysis))]
    md = markdown_sections((report_dir / "report.md").read_text())
    page = html_sections((report_dir / "report.html").read_text())
    assert [heading for heading, _ in md] == expected
    assert [heading for heading, _ in page] == expected
    # every summary line is on both pages, in its own section
    for (heading, lines), (_, md_body), (_, html_body) in zip(summary_sections(analysis).items(), md, page):
        for line in lines:
            assert " ".join(line.split()) in md_body and " ".join(line.split()) in html_body, (heading, line)


def test_html_page_escapes_text_from_the_results(tmp_path):
    factors = ["<b>a</b>", "b&c"]
    table = simulate_results(factors, 0.3, {("<b>a</b>",): 0.1}, seeds=2, rng=1)
    write_report(table, factors, tmp_path, formats=("html",))
    page = (tmp_path / "report.html").read_text()
    assert "<b>a</b>" not in page and "&lt;b&gt;a&lt;/b&gt;" in page
