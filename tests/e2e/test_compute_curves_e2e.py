"""The slower cases of tests/unit/test_compute_curves.py (the compute-curve figure rendered): in this
tree so the fast tier stays near a minute."""

from __future__ import annotations

import pytest

from dapo_ablate.reports.compute_curves import (
    analyze_curves,
)  # fmt: skip

from test_compute_curves import FACTORS, _half_bent  # noqa: F401, F811 - shared with the fast part


def test_the_figure_marks_extrapolations_and_curves_that_have_not_bent(tmp_path):
    """A fitted curve is solid only over the compute its cell's runs observed and dashed past their
    last evaluation (an extrapolation); a cell whose curve has not bent within its data is dotted,
    faded and "not enough data" in the legend; the report's caption says both."""
    import matplotlib.pyplot as plt

    from dapo_ablate.reports import write_report
    from dapo_ablate.reports.curve_plots import curve_axes

    table = _half_bent()
    analysis = analyze_curves(table, FACTORS)
    figure = curve_axes(analysis, table, FACTORS, "avg@32", True)
    axis = figure.axes[0]
    lines = {line.get_gid(): line for line in axis.get_lines() if line.get_gid()}
    labels = [text.get_text() for text in axis.get_legend().get_texts()]
    last = table.groupby(FACTORS)["tokens_generated"].max()  # every cell's last evaluation
    for cell in analysis.cells.itertuples(index=False):
        end = last.loc[(cell.a, cell.b, cell.c)]
        if cell.b:  # still rising at its last evaluation: the whole curve is drawn as not enough data
            line = lines[f"not bent {cell.cell}"]
            assert line.get_linestyle() == ":" and line.get_alpha() < 1
            assert f"fit {cell.cell}" not in lines and f"extrapolation {cell.cell}" not in lines
            assert any(label.startswith(cell.cell + " (") and "not enough data" in label for label in labels)
            continue
        fit, past = lines[f"fit {cell.cell}"], lines[f"extrapolation {cell.cell}"]
        assert fit.get_linestyle() == "-" and past.get_linestyle() == "--"
        assert max(fit.get_xdata()) == pytest.approx(end)  # solid up to the data's end, not a token further
        assert min(past.get_xdata()) == pytest.approx(end) and max(past.get_xdata()) > end
        assert fit.get_color() == past.get_color()
    assert {"extrapolated past the last evaluation", "not bent within the data: not enough data"} <= set(labels)
    plt.close(figure)

    last_rows = table.sort_values("step").groupby("run_id").tail(1)
    results = last_rows[[*FACTORS, "seed", "avg@32", "tokens_generated"]].assign(tokens_discarded=0.0, wall_s=1.0)
    write_report(results, FACTORS, tmp_path, curves=table, formats=["md", "png"])
    page = (tmp_path / "report.md").read_text()
    caption = page.split("`compute_curves.png`:", 1)[1].split("\n", 1)[0]
    assert "dashed beyond it: that part is an extrapolation" in caption, caption
    assert "dotted and faded: its asymptote is not enough data" in caption, caption
