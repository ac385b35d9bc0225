"""Report pages (Jinja2 templates) and the report's figures, on simulated factorials.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_report_figures_e2e.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dapo_ablate.reports import PAPER_FACTORS, analyze, write_report
from dapo_ablate.reports.pages import TEMPLATES
from dapo_ablate.reports.simulate import simulate_results

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


def _figure(monkeypatch, draw):
    """The matplotlib figure ``draw()`` builds (captured before it is rendered, left open)."""
    from dapo_ablate.reports import plots

    captured = []
    monkeypatch.setattr(plots, "figure_png", lambda figure, rect=None: captured.append(figure) or b"")
    draw()
    return captured[0]


def _titles(monkeypatch, draw) -> list[str]:
    """The titles of the figure's titled, visible axes (a twin axis has none)."""
    figure = _figure(monkeypatch, draw)
    return [axis.get_title() for axis in figure.axes if axis.get_visible() and axis.get_title()]


def test_templates_ship_inside_the_package():
    names = {path.name for path in TEMPLATES.iterdir()}
    assert {"report.md.j2", "report.html.j2", "transfer.md.j2", "transfer.html.j2"} <= names


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


def test_learning_curves_overlay_draws_every_cell_on_one_axis(monkeypatch, results):
    from dapo_ablate.reports import plots

    figure = _figure(monkeypatch, lambda: plots.curves_overlay_plot(_curves(results), FACTORS, "avg@32", True))
    (axis,) = figure.axes
    assert len(axis.get_lines()) == 32 and axis.get_ylabel() == "avg@32 (pp)"
    labels = [text.get_text() for text in axis.get_legend().get_texts()]
    finals = [float(label.rsplit(": ", 1)[1]) for label in labels]
    assert len(labels) == 32 and finals == sorted(finals, reverse=True)  # legend by final mean
    baseline = next(line for line in axis.get_lines() if line.get_label().startswith("GRPO: "))
    assert baseline.get_linestyle() == "--" and baseline.get_color() == "black"


def test_signals_by_technique_one_panel_per_signal_and_factor(monkeypatch, results):
    from dapo_ablate.reports import plots
    from dapo_ablate.reports.report import signals_table

    signals = signals_table(_signals(results), FACTORS)
    assert (signals["pg_clipfrac"] == signals["clipfrac_low"] + signals["clipfrac_high"]).all()
    assert plots.signal_columns(signals) == ["entropy", "pg_clipfrac"]  # clipfrac_low is constant: left out
    titles = _titles(monkeypatch, lambda: plots.signals_plot(signals, FACTORS))
    assert len(titles) == 5 and titles == ["OF", "CH", "SP", "TL", "DS"]  # the titled top row
    figure = _figure(monkeypatch, lambda: plots.signals_plot(signals, FACTORS))
    assert len(figure.axes) == 2 * 5


def test_signals_per_cell_one_panel_per_signal_one_line_per_cell(monkeypatch, results):
    from dapo_ablate.reports import plots
    from dapo_ablate.reports.report import signals_table

    signals = signals_table(_signals(results), FACTORS)  # entropy and pg_clipfrac vary
    figure = _figure(monkeypatch, lambda: plots.signals_by_cell_plot(signals, FACTORS))
    shown = [axis for axis in figure.axes if axis.get_visible()]
    assert [axis.get_title() for axis in shown] == ["actor/entropy", "actor/pg_clipfrac"]
    assert all(len(axis.get_lines()) == 32 for axis in shown)
    (legend,) = figure.legends
    assert len(legend.get_texts()) == 32 and legend.get_texts()[0].get_text() == "GRPO"
    baseline = shown[0].get_lines()[0]
    assert baseline.get_linestyle() == "--" and baseline.get_color() == "black"
    entropy = {line.get_label(): line.get_ydata() for line in shown[0].get_lines()}
    assert entropy["CH"][-1] > entropy["GRPO"][-1]  # clip-higher keeps entropy up in _signals


ROUNDS = {  # train/num_gen_batches per (dynamic sampling, seed, step), as each backend logs it
    "built-in, DS always 2 rounds": lambda ds, seed, step: 2.0 if ds else 1.0,  # the quickstart config's 6-step runs
    "built-in, DS 1-3 rounds": lambda ds, seed, step: 1.0 + ds * ((step + seed) % 3),
    "verl, logged with DS on only": lambda ds, seed, step: 2.0 + (step + seed) % 2 if ds else None,
}


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
    figure = _figure(monkeypatch, lambda: plots.cumulative_plot(shown, "avg@32", True, 0.95, "GRPO", "paper"))
    titled = [axis for axis in figure.axes if axis.get_title()]
    assert [axis.get_title() for axis in titled] == ["ordering paper", "ordering DS>TL>SP>CH>OF"]
    # the axis fits the data (not from 0): every mean and interval inside, with little to spare
    low, high = titled[0].get_ylim()
    values = 100 * shown[["mean", "ci_low", "ci_high"]].to_numpy(float)
    assert low > 0 and low <= values.min() and high >= values.max()
    assert (high - low) < 1.3 * (values.max() - values.min())
    # each value is written to the right of its point, clear of the interval's caps
    labels = [text for text in titled[0].texts if text.get_text() != "no cell"]
    assert len(labels) == 6 and all(text.xyann[0] > 0 and text.get_ha() == "left" for text in labels)
    # the paper's numbers on their own axis, beside the paper ordering only
    twins = [axis for axis in figure.axes if not axis.get_title()]
    assert len(twins) == 1 and [round(y) for y in twins[0].get_lines()[0].get_ydata()] == [30, 36, 38, 41, 42, 50]


def test_cumulative_figure_draws_the_cells_that_were_not_run_hollow(monkeypatch):
    """A half fraction (E = ABCD: the full cell is run, GRPO is not): along every ordering shown,
    a step whose cell the table lacks is a hollow point (the fitted model's prediction), a step whose
    cell was run a filled one, each at its mean, and the legend names both."""
    from dapo_ablate.reports import plots
    from dapo_ablate.reports.pages import cumulative_display
    from dapo_ablate.reports.report import REPORT_ORDERINGS_SHOWN

    half = [mask for mask in range(32) if mask.bit_count() % 2 == 1]
    table = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, noise_sd=0.01, rng=0, cells=half)
    run = {frozenset(f for f in FACTORS if row[f]) for _, row in table.iterrows()}
    analysis = analyze(table, FACTORS, orderings=[list(PAPER_FACTORS), list(reversed(PAPER_FACTORS))])
    shown = cumulative_display(analysis, REPORT_ORDERINGS_SHOWN)
    figure = _figure(monkeypatch, lambda: plots.cumulative_plot(shown, "avg@32", True, 0.95, "GRPO", "paper"))
    panels = [axis for axis in figure.axes if axis.get_title()]
    assert [axis.get_title() for axis in panels] == [f"ordering {name}" for name in dict.fromkeys(shown["ordering"])]
    hollow_seen = 0
    for axis, (name, rows) in zip(panels, shown.groupby("ordering", sort=False)):
        on = [frozenset(rows["added"].iloc[1:step + 1]) for step in range(len(rows))]  # each step's cell
        was_run = np.array([cell in run for cell in on])
        assert (rows["observed"].to_numpy(bool) == was_run).all()  # cumulative.csv's column says the same
        points = [line for line in axis.get_lines() if line.get_marker() == "o"]
        hollow = [line for line in points if line.get_markerfacecolor() != line.get_markeredgecolor()
                  and line.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))]  # fmt: skip
        solid = [line for line in points if line not in hollow]
        hollow_x = [int(x) for line in hollow for x in line.get_xdata()]
        solid_x = [int(x) for line in solid for x in line.get_xdata()]
        assert sorted(hollow_x) == list(np.flatnonzero(~was_run)), name
        assert sorted(solid_x) == list(np.flatnonzero(was_run)), name
        for line in points:
            np.testing.assert_allclose(line.get_ydata(), 100 * rows["mean"].to_numpy(float)[line.get_xdata().astype(int)])
        labels = [text.get_text() for text in axis.get_legend().get_texts()]
        assert "predicted (cell not run)" in labels and "observed (cell run)" in labels
        hollow_seen += len(hollow_x)
    assert not was_run[0] and hollow_seen  # GRPO (step 0) was not run: the case the marks are for


def test_interaction_legends_cover_no_data(results):
    """Each panel's legend (the second factor off / on) lies outside every panel: a legend drawn
    inside an axis covered the points and their intervals."""
    from dapo_ablate.reports import plots
    from dapo_ablate.reports.report import interaction_means

    figure = plots.interaction_figure(interaction_means(analyze(results, FACTORS)), "avg@32", True, 0.95)
    figure.tight_layout()
    renderer = figure.canvas.get_renderer()
    panels = [axis for axis in figure.axes if axis.get_visible()]
    assert len(panels) == 10
    for axis in panels:
        legend = axis.get_legend().get_window_extent(renderer)
        for other in panels:
            assert not legend.overlaps(other.get_window_extent(renderer)), axis.get_title()
    plots.plt.close(figure)
