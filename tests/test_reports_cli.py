"""`dapo-ablate report`: a Typer app with only the report command, driven by CliRunner."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from dapo_ablate.cli.report_cmd import parse_orderings, register
from dapo_ablate.reports import PAPER_FACTORS
from dapo_ablate.reports.simulate import simulate_results

FACTORS = list(PAPER_FACTORS)
PLANTED = {("overlong_filter",): 0.06, ("dynamic_sampling",): 0.08}


@pytest.fixture()
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop", hidden=True)  # a second command keeps `report` a named subcommand
    def noop() -> None:
        pass

    return app


@pytest.fixture()
def results_csv(tmp_path) -> Path:
    path = tmp_path / "results.csv"
    simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=0).to_csv(path, index=False)
    return path


def invoke(app, *args: str):
    return CliRunner().invoke(app, ["report", *args])


def test_report_from_a_results_csv(app, results_csv, tmp_path):
    out = tmp_path / "out"
    result = invoke(
        app, "--results", str(results_csv), "--out", str(out), "--format", "csv,md", "--seed", "3"
    )
    assert result.exit_code == 0, result.output
    assert "check passed" in result.output and "wrote 19 files" in result.output
    assert (
        (out / "shapley.csv").exists() and (out / "report.md").exists() and not (out / "report.html").exists()
    )


def _write(tmp_path: Path, table: pd.DataFrame) -> str:
    path = tmp_path / "bad.csv"
    table.to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize(
    "change, extra, message",
    [
        (
            lambda df: df.drop(columns=["clip_higher"]),
            ["--factors", ",".join(FACTORS)],
            "factor column 'clip_higher' is missing",
        ),
        (lambda df: df, ["--metric", "pass@1"], "metric column 'pass@1' is missing"),
        (
            lambda df: df.assign(soft_overlong=df["soft_overlong"] * 2),
            ["--factors", ",".join(FACTORS)],
            "factor column 'soft_overlong' has level 2",
        ),
        (
            lambda df: df.assign(**{"avg@32": df["avg@32"].where(df.index != 0)}),
            [],
            r"cell .*\(GRPO\), seed 0",
        ),
        (
            lambda df: df.iloc[2:],
            ["--design", "full"],
            r"the full design has no runs for cell .*\(GRPO\); run the missing cells",
        ),
    ],
)
def test_bad_csv_exits_2_with_one_sentence(app, tmp_path, change, extra, message):
    table = change(simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=1))
    result = invoke(app, "--results", _write(tmp_path, table), "--out", str(tmp_path / "out"), *extra)
    assert result.exit_code == 2
    assert re.search(message, result.output), result.output
    assert not (tmp_path / "out").exists()  # nothing written on bad input


def test_incomplete_design_without_declaration_is_reported(app, tmp_path):
    table = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, cells=[0, 1, 3, 7, 15, 31], rng=2)
    result = invoke(
        app, "--results", _write(tmp_path, table), "--out", str(tmp_path / "out"), "--format", "md"
    )
    assert result.exit_code == 0, result.output
    assert "Incomplete design: 6 of 32 cells" in result.output


def test_spec_and_results_are_exclusive(app, results_csv, tmp_path):
    assert invoke(app, "--out", str(tmp_path)).exit_code == 2
    assert invoke(app, "spec.yaml", "--results", str(results_csv), "--out", str(tmp_path)).exit_code == 2


def test_unknown_format_exits_2(app, results_csv, tmp_path):
    result = invoke(app, "--results", str(results_csv), "--out", str(tmp_path / "o"), "--format", "csv,pdf")
    assert result.exit_code == 2 and "unknown format pdf" in result.output


def test_report_from_a_spec_logs_to_mlflow(app, tmp_path, monkeypatch):
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=3)
    logged = []

    class Logger:  # stands in for the experiment's MLflow parent run
        def log_artifacts(self, local_dir, artifact_path=None):
            logged.append((local_dir, artifact_path))

    module = types.ModuleType("dapo_ablate.ablation.results")
    module.load_experiment_results = lambda spec: (results, FACTORS, None, "full", Logger())
    module.ResultsError = type("ResultsError", (ValueError,), {})
    monkeypatch.setattr("dapo_ablate.ablation.spec.load_spec", lambda spec: types.SimpleNamespace(metric="avg@32"))
    monkeypatch.setitem(sys.modules, "dapo_ablate.ablation.results", module)
    out = tmp_path / "out"
    result = invoke(app, str(tmp_path / "factorial.yaml"), "--out", str(out), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert logged == [(str(out), "report")]


def test_parse_orderings():
    assert parse_orderings("paper") == "paper"
    assert parse_orderings("OF,CH;CH,OF") == [["OF", "CH"], ["CH", "OF"]]
