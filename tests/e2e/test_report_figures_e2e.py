"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_report_figures.py
describes; its docstring says what they check."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dapo_ablate.reports import ReportOptions, analyze, write_report
from dapo_ablate.reports.report import _report_tables, evidence_files
from dapo_ablate.reports.simulate import simulate_results
from dapo_ablate.reports.summary import summary_sections

from test_report_figures import (  # noqa: F401, F811 - shared with the fast part
    FACTORS,
    PLANTED,
    ROUNDS,
    _curves,
    _figure,
    _signals,
    report_dir,
    results,
)


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


def test_html_page_escapes_text_from_the_results(tmp_path):
    factors = ["<b>a</b>", "b&c"]
    table = simulate_results(factors, 0.3, {("<b>a</b>",): 0.1}, seeds=2, rng=1)
    write_report(table, factors, tmp_path, formats=("html",))
    page = (tmp_path / "report.html").read_text()
    assert "<b>a</b>" not in page and "&lt;b&gt;a&lt;/b&gt;" in page


def test_order_table_shows_distinct_comparisons(results, report_dir):
    text = (report_dir / "orderings.md").read_text()
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| overlong_filter")]
    cells = [[cell.strip() for cell in row] for row in rows]
    assert [row[1] for row in cells] == ["1", "2", "3", "4", "5", "all"]
    assert [row[2] for row in cells] == ["1", "4", "6", "4", "1", "16"]  # not 24 orderings at positions 1 and 5
    assert cells[0][6:8] == ["", ""] and cells[4][6:8] == ["", ""]  # one comparison: no min / max
    assert "n_orderings" in pd.read_csv(report_dir / "orderings.csv").columns  # the CSV keeps its contract


def test_a_signal_only_one_technique_moves_is_compared_over_its_runs(monkeypatch, results):
    """train/num_gen_batches is 1 without dynamic sampling: in the other columns it is drawn over
    the runs with DS on (no flat 1.5 line with a 0.5-2.5 band made of DS's own effect)."""
    from dapo_ablate.reports import plots
    from dapo_ablate.reports.report import signals_table

    signals = _signals(results)
    signals["gen_rounds"] = 1 + signals["dynamic_sampling"] * (1 + (signals["step"] + signals["seed"]) % 2)
    signals = signals_table(signals, FACTORS)
    assert plots.signal_owner(signals, "gen_rounds", FACTORS) == "dynamic_sampling"
    assert plots.signal_owner(signals, "entropy", FACTORS) is None
    figure = _figure(monkeypatch, lambda: plots.signals_plot(signals, FACTORS))
    axes = figure.axes[2 * 5: 3 * 5]  # the third signal row (entropy, pg_clipfrac, gen_rounds)
    assert axes[0].get_ylabel() == "train/num_gen_batches"
    notes = [[text.get_text() for text in axis.texts] for axis in axes]
    assert notes[:4] == [["runs with DS on"]] * 4 and notes[4] == []
    for axis in axes[:4]:  # over DS-on runs only: both levels' means are 2 to 3, never the 1.5 mixture
        for line in axis.get_lines():
            assert (line.get_ydata() >= 2).all()


@pytest.mark.parametrize("shape", list(ROUNDS))
def test_num_gen_batches_is_drawn_over_the_ds_on_runs_from_the_ledger(monkeypatch, tmp_path, shape):
    """`report SPEC` on a ledger whose runs logged train/num_gen_batches as the trainers do (1 or
    nothing without dynamic sampling): in every other technique's column of signals.png its lines
    are the per-step means over the DS-on runs (said on the panel), never the mixture with the
    DS-off runs; the DS column shows off and on. It was the mixture when every DS-on step took the
    same number of rounds (the built-in quickstart config: 2)."""
    from typer.testing import CliRunner

    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import build_spec
    from dapo_ablate.ablation.runtime.executor import record_spec
    from dapo_ablate.ablation.store.binding import experiment_digest
    from dapo_ablate.ablation.store.ledger import SQLLedger
    from dapo_ablate.cli.main import app
    from dapo_ablate.reports import plots

    from support import spec_data, write_spec

    factors = ["clip_higher", "dynamic_sampling"]
    fields = {"factors": factors, "seeds": 2}
    spec = build_spec(spec_data(tmp_path, "ds-signals", **fields))
    rounds = ROUNDS[shape]
    logged = []
    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
        ledger.add_runs(spec.name, expand(spec).run_specs())
        for run in expand(spec).runs:
            ch, ds = (int(run.factors[f]) for f in factors)
            steps = []
            for step in range(1, 5):
                point = {"step": step, "entropy": 1.0 - 0.05 * step - 0.02 * ch + 0.01 * run.seed}
                if rounds(ds, run.seed, step) is not None:
                    point["gen_rounds"] = rounds(ds, run.seed, step)
                steps.append(point)
                logged.append({"clip_higher": ch, "dynamic_sampling": ds, "step": step, "rounds": point.get("gen_rounds")})
            assert ledger.claim(run.run_id, "h")
            ledger.finish(run.run_id, {"metrics": {"avg@32": 0.3 + 0.05 * ds + 0.01 * run.seed}, "signals": steps,
                                       "tokens_generated": 1, "tokens_discarded": 0, "wall_s": 1.0})  # fmt: skip
    record_spec(spec)
    figures = []
    monkeypatch.setattr(plots, "figure_png", lambda figure, rect=None: figures.append(figure) or b"png")
    result = CliRunner().invoke(app, ["report", str(write_spec(tmp_path, "ds-signals", **fields)), "--out",
                                      str(tmp_path / "report"), "--format", "png"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (figure,) = [f for f in figures if f.get_suptitle().startswith("Training signals by technique")]
    rows = [axis for axis in figure.axes if axis.get_ylabel()]
    row = figure.axes.index(next(axis for axis in rows if axis.get_ylabel() == "train/num_gen_batches"))
    panels = figure.axes[row:row + len(factors)]
    table = pd.DataFrame(logged)
    ds_on = table[table["dynamic_sampling"] == 1]
    for axis, factor in zip(panels, factors):
        runs = table if factor == "dynamic_sampling" else ds_on
        notes = [text.get_text() for text in axis.texts]
        assert notes == ([] if factor == "dynamic_sampling" else ["runs with DS on"]), (factor, notes)
        for level, line in zip((0, 1), axis.get_lines()):
            expected = runs[runs[factor] == level].groupby("step")["rounds"].mean()  # NaN: not logged at that level
            np.testing.assert_allclose(np.asarray(line.get_ydata(), float), expected.to_numpy(float), err_msg=f"{factor} {level}")
    for drawn in figures:
        plots.plt.close(drawn)
