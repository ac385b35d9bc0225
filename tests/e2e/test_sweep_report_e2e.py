"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_sweep_report.py
describes; its docstring says what they check."""

from __future__ import annotations

import base64
import re

import optuna
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from dapo_ablate.cli import sweep_cmd
from dapo_ablate.reports.export import column_unit, html_table, markdown_table
from dapo_ablate.reports.pages import TEMPLATES
from dapo_ablate.sweeps import plots
from dapo_ablate.sweeps import study as studies
from dapo_ablate.sweeps.knobs import knob_digits, knob_text
from dapo_ablate.sweeps.report import HTML_PAGE, build_report, write_report
from dapo_ablate.sweeps.report_data import shown_best
from dapo_ablate.sweeps.spec import build_sweep

from test_sweep_report import (  # noqa: F401, F811 - shared with the fast part
    SPACE,
    accuracy,
    close_figures,
    fill,
    headers,
    markdown_rows,
    report_of,
    sweep_data,
)

HOSTILE = "<img src=x onerror=alert(1)>&"


def number_cells(page: str) -> list[str]:
    """The cells of class "num" (right-aligned numbers) of every table on an HTML page."""
    return re.findall(r'<td class="[^"]*\bnum\b[^"]*"\s*>(.*?)</td>', page, flags=re.S)


def typer_app():
    import typer

    app = typer.Typer()
    sweep_cmd.register(app)
    return app


def test_html_page_holds_the_tables_warning_and_figures_and_escapes_names(tmp_path):
    report = report_of(8, seeds=2, name=f"study {HOSTILE}", factor=HOSTILE)
    paths = {p.name for p in write_report(report, tmp_path)}
    assert {HTML_PAGE, "report.md", "history.png", "knobs.png", "importances.png", "effects.png"} <= paths
    page = (tmp_path / HTML_PAGE).read_text()
    assert "<img src=x" not in page and "onerror=alert(1)>&" not in page
    assert "study &lt;img src=x onerror=alert(1)&gt;&amp;" in page  # the title and the heading
    assert f"effect.{HOSTILE} (pp)" in headers(page)  # a trials header, escaped on the page
    assert {"avg@4 (pp)", "importance (% of variance)", "effect (pp)", "95% CI (pp)", "mean effect (pp)"} <= set(headers(page))
    for title in ("Best setting", "Parameter importances (fANOVA)", "Factor effects across knob settings", "Trials"):
        assert f"<h2>{title}</h2>" in page
    assert '<p class="warning"><strong>Warning: these importances rest on 7 complete trials, fewer than 20' in page
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4 and all(base64.b64decode(data).startswith(b"\x89PNG") for data in images)
    assert "<script" not in page and "http" not in page  # self-contained, nothing to load
    # knob values rounded on the page, full precision in the CSV
    trials = pd.read_csv(tmp_path / "trials.csv")
    lr = report.best_params["lr"].iloc[0]
    assert knob_text(lr, knob_digits(report.trials["lr"].dropna())) in number_cells(page)
    assert trials["lr"].tolist() == pytest.approx(report.trials["lr"].tolist(), rel=1e-12)


def test_pages_render_through_the_experiment_reports_templates_and_table_writers(tmp_path):
    report = report_of(6, seeds=2)
    write_report(report, tmp_path)
    page = (tmp_path / HTML_PAGE).read_text()
    # the experiment report's frame and CSS, its figure macro, its table writer (Styler, class "num")
    assert page.startswith("<!DOCTYPE html>") and (TEMPLATES / "report.css").read_text().strip() in page
    assert "<figure>\n<img alt=\"knobs.png\" src=\"data:image/png;base64," in page
    assert '<figcaption class="caption">knobs.png: avg@4 (pp) against each knob' in page
    table = page[page.index("<h2>Best setting</h2>"):page.index("<h2>Parameter importances")]
    shown = shown_best(report)
    assert '<div class="scroll">' + html_table(shown.frame, [c in shown.numeric for c in shown.frame.columns]) in table
    text = (tmp_path / "report.md").read_text()
    assert markdown_table(shown.frame, [c in shown.numeric for c in shown.frame.columns]) in text
    assert "**Figure** `knobs.png`: avg@4 (pp) against each knob" in text


def test_sweep_report_command_writes_the_page_for_a_stored_study(tmp_path):
    data = sweep_data(ledger=f"sqlite:///{tmp_path}/ledger.db", output_dir=str(tmp_path / "runs"), factors=["clip_higher"])
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = build_sweep(data)
    study = studies.open_study(spec, studies.open_storage(spec, heartbeat=False))
    fill(study, spec, 5, seeds=1, pruned=2)
    app = typer_app()
    result = CliRunner().invoke(app, ["sweep-report", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert HTML_PAGE in result.output
    page = (tmp_path / "r" / HTML_PAGE).read_text()
    assert "Trial " in page and "one seed per setting, so no interval" in page
    assert "CI (pp)" not in page and "CI above 0" not in page  # one seed: no interval column promised
    assert "4 complete, 1 pruned" in page
    assert (tmp_path / "r" / "units.csv").is_file()


def test_importances_warn_below_20_trials_in_the_figure_and_not_from_20():
    few = report_of(8, seeds=1, pruned=None)
    figure = plots.importance_figure(few)
    (axis,) = figure.axes
    assert "only 8 complete trials (fewer than 20)" in " ".join(axis.get_title(loc="left").split())
    assert axis.get_xlabel().startswith("importance (% of variance")
    assert "8 complete trials, fewer than 20" in few.importance_warning
    enough = report_of(20, seeds=1, pruned=None)
    assert enough.importance_warning == ""
    (axis,) = plots.importance_figure(enough).axes
    assert axis.get_title(loc="left") == ""


def test_csvs_keep_fractions_and_their_columns_and_units_csv_names_their_units(tmp_path):
    report = report_of(6, seeds=2)
    paths = {p.name for p in write_report(report, tmp_path)}
    assert "units.csv" in paths
    trials = pd.read_csv(tmp_path / "trials.csv")
    assert list(trials.columns) == list(report.trials.columns) and "unit" not in trials.columns
    assert trials["avg@4"].dropna().between(0, 1).all()
    effects = pd.read_csv(tmp_path / "effects.csv")
    assert list(effects.columns) == ["trial", "factor", "eps_high", "lr", "overlong_cache", "effect", "ci_low", "ci_high",
                                     "seeds"]
    assert effects["effect"].tolist() == pytest.approx(report.effects["effect"].tolist())  # fractions, not pp
    assert list(pd.read_csv(tmp_path / "importances.csv").columns) == ["target", "knob", "importance", "complete_trials"]
    assert list(pd.read_csv(tmp_path / "best_params.csv").columns) == ["trial", "avg@4", "eps_high", "lr", "overlong_cache"]
    assert "unit" not in pd.read_csv(tmp_path / "effect_summary.csv").columns
    # units.csv: every column of every CSV, in the experiment report's words (reports.export.units_table)
    units = pd.read_csv(tmp_path / "units.csv", keep_default_na=False)
    assert list(units.columns) == ["file", "column", "unit"]
    for name in ("best_params.csv", "trials.csv", "importances.csv", "effects.csv", "effect_summary.csv"):
        assert units.loc[units["file"] == name, "column"].tolist() == list(pd.read_csv(tmp_path / name).columns)
    unit = {(row.file, row.column): row.unit for row in units.itertuples()}
    fraction = column_unit("mean", True, set())
    assert fraction == "fraction (x100 = pp)"
    for column in ("avg@4", "effect.clip_higher", "effect.clip_higher.ci_low", "effect.clip_higher.ci_high"):
        assert unit["trials.csv", column] == fraction
    assert unit["best_params.csv", "avg@4"] == unit["effects.csv", "effect"] == unit["effects.csv", "ci_low"] == fraction
    assert unit["effect_summary.csv", "mean_effect"] == unit["effect_summary.csv", "max_effect"] == fraction
    assert unit["effect_summary.csv", "share_ci_above_0"] == unit["importances.csv", "importance"] == "fraction (x100 = %)"
    assert unit["trials.csv", "seconds"] == "seconds" and unit["effects.csv", "seeds"] == "count"
    assert unit["trials.csv", "lr"] == unit["trials.csv", "state"] == unit["trials.csv", "trial"] == ""
    text = (tmp_path / "report.md").read_text()
    best = report.best_params.iloc[0]
    assert f"avg@4 {100 * best['avg@4']:.1f} pp at eps_high=" in text
    assert ["trial", "avg@4 (pp)", "eps_high", "lr", "overlong_cache"] in markdown_rows(text)
    assert "> **Warning: these importances rest on 5 complete trials" in text
    assert "units.csv" in text and "unit column" not in text


def test_a_metric_that_is_not_a_fraction_reads_as_it_is(tmp_path):
    spec = build_sweep(sweep_data())
    study = optuna.create_study(study_name="length", direction="minimize", sampler=studies.make_sampler(spec))
    for _ in range(4):
        trial = study.ask(fixed_distributions=studies.distributions(spec))
        study.tell(trial, 20 + 10 * trial.params["eps_high"])  # a response length in tokens
    report = build_report(study, "response_length/mean", list(spec.space), [])
    assert not report.percent
    write_report(report, tmp_path)
    page = (tmp_path / HTML_PAGE).read_text()
    assert "response_length/mean" in headers(page) and "(pp)" not in page and "percentage points" not in page
    assert "unit" not in pd.read_csv(tmp_path / "trials.csv").columns
    units = pd.read_csv(tmp_path / "units.csv", keep_default_na=False)
    assert set(units.loc[units["column"] == "response_length/mean", "unit"]) == {"metric units"}
    (axis,) = plots.history_figure(report).axes
    assert axis.get_ylabel() == "response_length/mean"
