"""`dapo-ablate report`: a Typer app with only the report command, driven by CliRunner."""

from __future__ import annotations

import re
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
    assert "check passed" in result.output and "wrote 25 files" in result.output
    claims = len(pd.read_csv(out / "claims.csv"))
    assert f"claims.csv: {claims} claims, one row per sentence" in result.output
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


@pytest.mark.parametrize(
    "change, extra, message",
    [
        (
            lambda df: df.assign(**{"avg@32": df["avg@32"].where(df.index != 5, float("inf"))}),
            [],
            r"metric column 'avg@32' is infinite in cell .*\(CH\), seed 1; drop those runs",
        ),
        (lambda df: df, ["--metric", "wall_s"], r"--metric wall_s names a compute column, not an outcome"),
        (
            lambda df: df.assign(kl_penalty=1),
            ["--factors", ",".join([*FACTORS, "kl_penalty"])],
            r"factor column 'kl_penalty' is 1 in every row; a factor needs runs at both levels",
        ),
        (
            lambda df: df.assign(clip_higher=df["clip_higher"].where(df.index != 7, 2)),
            [],
            r"factor column 'clip_higher' has level 2 \(data row 8, seed 1\); code each factor 0/1",
        ),
        (
            lambda df: df.assign(clip_higher=df["clip_higher"] * 2 - 1).assign(
                soft_overlong=df["soft_overlong"].where(df.index != 3, -1)
            ),
            [],
            r"factor column 'soft_overlong' has level -1 .*code each factor 0/1",
        ),
        (lambda df: df, ["--adjust", "bonferroni"], r"--adjust 'bonferroni' is not one of holm, bh, none"),
        (
            lambda df: df[df[FACTORS[:4]].sum(axis=1) % 2 == 0],
            ["--design", "fraction-V"],
            r"resolution IV fraction, so two-factor interactions are aliased",
        ),
    ],
)
def test_more_bad_inputs_exit_2_with_one_sentence(app, tmp_path, change, extra, message):
    table = change(simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=1))
    result = invoke(app, "--results", _write(tmp_path, table), "--out", str(tmp_path / "out"), *extra)
    assert result.exit_code == 2, result.output
    assert re.search(message, result.output), result.output
    assert len(result.output.strip().splitlines()) == 1  # one sentence, no traceback
    assert not (tmp_path / "out").exists()


def test_constant_column_is_not_inferred_as_a_factor(app, tmp_path):
    table = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=4).assign(kl_penalty=0)
    out = tmp_path / "out"
    result = invoke(app, "--results", _write(tmp_path, table), "--out", str(out), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert "full 2^5 factorial" in result.output and "kl_penalty" not in pd.read_csv(out / "cells.csv").columns


def test_minus_one_plus_one_coding_gives_the_same_report(app, tmp_path):
    table = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=5)
    recoded = table.assign(**{f: table[f] * 2 - 1 for f in FACTORS})
    outputs = []
    for name, frame in (("zero_one", table), ("plus_minus", recoded)):
        path = tmp_path / f"{name}.csv"
        frame.to_csv(path, index=False)
        result = invoke(app, "--results", str(path), "--out", str(tmp_path / name), "--format", "csv")
        assert result.exit_code == 0, result.output
        outputs.append(pd.read_csv(tmp_path / name / "claims.csv"))
    pd.testing.assert_frame_equal(*outputs)
    assert len(outputs[0]) >= 2


def test_seed_option_changes_nothing(app, results_csv, tmp_path):
    for seed in ("0", "7"):
        result = invoke(app, "--results", str(results_csv), "--out", str(tmp_path / seed), "--format", "csv", "--seed", seed)
        assert result.exit_code == 0, result.output
    for name in ("shapley.csv", "effects.csv", "claims.csv", "intervals.csv"):
        assert (tmp_path / "0" / name).read_bytes() == (tmp_path / "7" / name).read_bytes()


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
    result = invoke(app, "--results", str(results_csv), "--out", str(tmp_path / "o"), "--format", "csv,docx")
    assert result.exit_code == 2 and "unknown format docx" in result.output


def test_report_from_a_spec_logs_to_mlflow(app, tmp_path, monkeypatch):
    results = simulate_results(FACTORS, 0.30, PLANTED, seeds=2, rng=3)
    logged = []

    class Logger:  # stands in for the experiment's MLflow parent run
        def log_artifacts(self, local_dir, artifact_path=None):
            logged.append((local_dir, artifact_path))

    from dapo_ablate.ablation.app import report as app_report

    asked = []

    def load_experiment(path, overrides):
        asked.append((path, overrides))
        return types.SimpleNamespace(spec=types.SimpleNamespace(metric="avg@32", name="exp", output_dir=str(tmp_path / "runs"), design="full", adaptive=None, confirm=None,
                                                            setting_infos=lambda: []), plan=types.SimpleNamespace(factors=[]))

    monkeypatch.setattr(app_report, "load_experiment_results", lambda spec: (results, FACTORS, None, "full", Logger()))
    monkeypatch.setattr(app_report, "load_signals", lambda spec, plan: None)  # no training signals
    monkeypatch.setattr(app_report, "load_experiment", load_experiment)
    monkeypatch.setattr(app_report, "experiment_provenance", lambda experiment, done, parent: (f"{done} runs, a stand-in",))
    monkeypatch.setattr(app_report, "held_on", lambda spec: ())
    monkeypatch.setattr(app_report, "record_data", lambda spec: {"name": spec.name})
    out = tmp_path / "out"
    result = invoke(app, str(tmp_path / "factorial.yaml"), "seeds=[0,1]", "--out", str(out), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert logged == [(str(out), "report")]
    assert asked == [(tmp_path / "factorial.yaml", ["seeds=[0,1]"])]  # the overrides reach the spec


def test_overrides_do_not_apply_to_a_results_csv(app, results_csv, tmp_path):
    for extra in (["seeds=[0,1]"], [str(results_csv.parent / "x.yaml"), "seeds=[0,1]"]):
        result = invoke(app, *extra, "--results", str(results_csv), "--out", str(tmp_path / "o"))
        assert result.exit_code == 2 and "error: " in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "overrides apply to an experiment spec" in result.stderr and not (tmp_path / "o").exists()


def test_parse_orderings():
    assert parse_orderings("paper") == "paper"
    assert parse_orderings("OF,CH;CH,OF") == [["OF", "CH"], ["CH", "OF"]]


@pytest.mark.parametrize("kind", ["a file", "under /proc"])
def test_an_out_that_cannot_be_a_folder_is_one_sentence(app, results_csv, tmp_path, kind):
    out = tmp_path / "taken" if kind == "a file" else Path("/proc/dapo-ablate-report")
    if kind == "a file":
        out.write_text("")
    result = invoke(app, "--results", str(results_csv), "--out", str(out))
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "--out" in result.stderr


def test_a_header_only_claims_csv_is_said_to_hold_no_claims(app, tmp_path):
    table = simulate_results(FACTORS[:3], 0.30, {}, seeds=2, noise_sd=0.01, rng=5)  # nothing planted
    result = invoke(app, "--results", _write(tmp_path, table), "--out", str(tmp_path / "out"), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(tmp_path / "out" / "claims.csv")) == 0
    assert "claims.csv: header only: nothing is supported by the data" in result.output
