"""Report pages (Jinja2 templates) and the report's figures, on simulated factorials."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
import pytest

from dapo_ablate.reports import PAPER_FACTORS, analyze, write_report
from dapo_ablate.reports.pages import TEMPLATES
from dapo_ablate.reports.report import _report_tables
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


# -- figures -------------------------------------------------------------------------------------
def _signals(results: pd.DataFrame) -> pd.DataFrame:
    """Per-step signals: entropy falls more slowly with clip_higher on; clip fractions per bound."""
    rows = []
    for _, run in results.iterrows():
        for step in range(1, 6):
            rows.append({
                **{f: run[f] for f in FACTORS}, "seed": run["seed"], "step": step,
                "entropy": 1.0 - step * (0.1 - 0.05 * run["clip_higher"]) + 0.01 * run["seed"],
                "clipfrac_low": 0.01, "clipfrac_high": 0.02 + 0.01 * run["seed"],
            })  # fmt: skip
    return pd.DataFrame(rows)


FIGURES = [
    "cumulative.png", "shapley.png", "gain_by_position.png", "effects.png", "interactions.png",
    "learning_curves.png", "signals.png",
]  # fmt: skip


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


def test_interaction_means_are_the_two_by_two_marginal_means(results):
    from dapo_ablate.reports.report import interaction_means

    analysis = analyze(results, FACTORS)
    means = interaction_means(analysis)
    assert len(means) == 4 * 10  # every pair of five factors, 2 x 2 means each
    # balanced full design: a marginal mean is the plain mean of the runs at those two levels
    ch_ds = means[(means["a"] == "clip_higher") & (means["b"] == "dynamic_sampling")].set_index(["a_level", "b_level"])
    plain = results.groupby(["clip_higher", "dynamic_sampling"])["avg@32"].mean()
    for levels, value in plain.items():
        assert ch_ds.loc[levels, "mean"] == pytest.approx(value, abs=1e-12)
        assert ch_ds.loc[levels, "ci_low"] < value < ch_ds.loc[levels, "ci_high"]
    # the interaction effect (-1/+1 coding) is half the difference of the two lines' slopes
    m = ch_ds["mean"]
    effect = analysis.effects.set_index("term").loc["clip_higher:dynamic_sampling", "effect"]
    assert (m[1, 1] - m[0, 1] - m[1, 0] + m[0, 0]) / 2 == pytest.approx(effect, abs=1e-12)
    assert bool(ch_ds["supported"].iloc[0])  # the planted +3 pp interaction is a claim


def test_interaction_plots_need_every_cell():
    from dapo_ablate.reports.report import interaction_means

    partial = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, cells=[0, 1, 3, 7, 15, 31], rng=2)
    assert interaction_means(analyze(partial, FACTORS)).empty


def test_order_table_shows_distinct_comparisons(results, report_dir):
    text = (report_dir / "orderings.md").read_text()
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| overlong_filter")]
    cells = [[cell.strip() for cell in row] for row in rows]
    assert [row[1] for row in cells] == ["1", "2", "3", "4", "5", "all"]
    assert [row[2] for row in cells] == ["1", "4", "6", "4", "1", "16"]  # not 24 orderings at positions 1 and 5
    assert cells[0][6:8] == ["", ""] and cells[4][6:8] == ["", ""]  # one comparison: no min / max
    assert "n_orderings" in pd.read_csv(report_dir / "orderings.csv").columns  # the CSV keeps its contract


def _titles(monkeypatch, draw) -> list[str]:
    """The axes titles of the figure ``draw()`` builds (captured before it is rendered)."""
    from dapo_ablate.reports import plots

    captured = []
    monkeypatch.setattr(plots, "figure_png", lambda figure, rect=None: captured.append(figure) or b"")
    draw()
    return [axis.get_title() for axis in captured[0].axes if axis.get_visible()]


def test_learning_curves_are_small_multiples_labelled_by_cell(monkeypatch, results):
    from dapo_ablate.reports import plots

    titles = _titles(monkeypatch, lambda: plots.curves_plot(_curves(results), FACTORS, "avg@32", True))
    assert len(titles) == 32 and titles[0].startswith("GRPO: ") and titles[-1].startswith("OF+CH+SP+TL+DS: ")


def test_signals_by_technique_one_panel_per_signal_and_factor(monkeypatch, results):
    from dapo_ablate.reports import plots
    from dapo_ablate.reports.report import signals_table

    signals = signals_table(_signals(results), FACTORS)
    assert (signals["pg_clipfrac"] == signals["clipfrac_low"] + signals["clipfrac_high"]).all()
    assert plots.signal_columns(signals) == ["entropy", "pg_clipfrac"]  # clipfrac_low is constant: left out
    titles = _titles(monkeypatch, lambda: plots.signals_plot(signals, FACTORS))
    assert len(titles) == 2 * 5 and titles[:5] == ["OF", "CH", "SP", "TL", "DS"]


def test_signals_without_a_step_column_are_refused(results, tmp_path):
    from dapo_ablate.reports import ReportInputError

    with pytest.raises(ReportInputError, match="the training signals lack column 'step'"):
        write_report(results, FACTORS, tmp_path, signals=_signals(results).drop(columns="step"))


def test_cumulative_figure_has_one_panel_per_ordering_shown(monkeypatch, results):
    from dapo_ablate.reports import plots
    from dapo_ablate.reports.pages import cumulative_display
    from dapo_ablate.reports.report import REPORT_ORDERINGS_SHOWN

    analysis = analyze(results, FACTORS, orderings=[list(PAPER_FACTORS), list(reversed(PAPER_FACTORS))])
    shown = cumulative_display(analysis, REPORT_ORDERINGS_SHOWN)
    assert shown.loc[shown["ordering"] == "paper", "paper"].tolist() == [30, 36, 38, 41, 42, 50]
    titles = _titles(monkeypatch, lambda: plots.cumulative_plot(shown, "avg@32", True, 0.95, "GRPO", "paper"))
    assert titles == ["ordering paper", "ordering DS>TL>SP>CH>OF"]
