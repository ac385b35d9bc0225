"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_report_figures.py
describes; its docstring says what they check."""

from __future__ import annotations

import html
import re

import pandas as pd

from dapo_ablate.reports import ReportOptions, analyze, write_report
from dapo_ablate.reports.report import _report_tables, evidence_files
from dapo_ablate.reports.summary import summary_sections

from test_report_figures import FACTORS, PLANTED, _curves, _figure, _signals, report_dir, results  # noqa: F401, F811 - shared with the fast part


def markdown_sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section of a Markdown page, bodies whitespace-normalised."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)[1:]
    return [(parts[i].strip(), " ".join(parts[i + 1].split())) for i in range(0, len(parts), 2)]


def html_sections(text: str) -> list[tuple[str, str]]:
    """(heading, visible text) of each ``<h2>`` section of an HTML page."""
    parts = re.split(r"<h2>(.*?)</h2>", text, flags=re.S)[1:]
    visible = lambda part: " ".join(html.unescape(re.sub(r"<[^>]+>", " ", part)).split())  # noqa: E731
    return [(html.unescape(parts[i]), visible(parts[i + 1])) for i in range(0, len(parts), 2)]


FIGURES = [
    "cumulative.png", "shapley.png", "gain_by_position.png", "effects.png", "interactions.png",
    "learning_curves.png", "learning_curves_overlay.png", "signals.png", "signals_by_cell.png", "compute_curves.png",
]  # fmt: skip


def _cells(table: pd.DataFrame, masks: list[int]) -> pd.DataFrame:
    """The rows of ``table`` whose cell (bit i: FACTORS[i] on) is in ``masks``."""
    mask = sum(table[f].astype(int) * 2**i for i, f in enumerate(FACTORS))
    return table[mask.isin(masks)]


def test_markdown_and_html_pages_show_the_same_sections(results, report_dir, tmp_path):
    analysis = analyze(results, FACTORS)
    evidence_files(analysis, results, ReportOptions(), None, tmp_path)  # its sections join the summary, as in write_report
    expected = [*summary_sections(analysis), *(title for title, _, _ in _report_tables(analysis))]
    md = markdown_sections((report_dir / "report.md").read_text())
    page = html_sections((report_dir / "report.html").read_text())
    assert [heading for heading, _ in md] == expected
    assert [heading for heading, _ in page] == expected
    # every summary line is on both pages, in its own section
    for (heading, lines), (_, md_body), (_, html_body) in zip(summary_sections(analysis).items(), md, page):
        for line in lines:
            assert " ".join(line.split()) in md_body and " ".join(line.split()) in html_body, (heading, line)


def test_every_figure_is_a_png_with_a_caption_on_both_pages(results, tmp_path):
    written = write_report(results, FACTORS, tmp_path, curves=_curves(results), signals=_signals(results))
    assert set(FIGURES) <= set(written)
    for name in FIGURES:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert md.index("## Headline") < md.index("## Design")  # the summary opens with the headline
    for name in FIGURES:
        assert re.search(rf"!\[{name}\]\({name}\)\n\n\*\*Figure\*\* `{name}`: \S", md), name
        assert re.search(rf'<img alt="{name}" src="data:image/png;base64,[^"]+">\s*<figcaption class="caption">{name}: \S', page)


def test_learning_curves_are_a_grid_of_at_most_four_per_row(monkeypatch, results):
    from dapo_ablate.reports import plots

    figure = _figure(monkeypatch, lambda: plots.curves_plot(_curves(results), FACTORS, "avg@32", True))
    shown = [axis for axis in figure.axes if axis.get_visible()]
    grid = shown[0].get_subplotspec().get_gridspec()
    assert (grid.nrows, grid.ncols) == (8, 4) and len(shown) == 32
    titles = [axis.get_title() for axis in shown]
    assert titles[0].startswith("GRPO: ") and titles[-1].startswith("OF+CH+SP+TL+DS: ")
    assert all(axis.get_ylabel() == "avg@32 (pp)" for axis in shown if axis.get_subplotspec().is_first_col())
    # five cells: a short last row; the panel above each empty slot carries its own step axis
    few = _figure(monkeypatch, lambda: plots.curves_plot(_cells(_curves(results), [0, 1, 2, 4, 8]), FACTORS, "avg@32", True))
    visible = [axis for axis in few.axes if axis.get_visible()]
    assert len(visible) == 5 and sum(axis.get_xlabel() == "step" for axis in visible) == 4
