"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_headline.py
describes; its docstring says what they check."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_ablate.reports.headline import BEST_CELL_TAG, HEADLINE_TAG

from test_headline import write_two_factor_spec  # noqa: F401, F811 - shared with the fast part


# -- a finished tiny experiment through the executor, then `dapo-ablate report` -----------------
def noisy_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """avg@32 = 0.3 + 0.1 OF + 0.2 CH plus a fixed wobble per (cell, seed)."""
    techniques, seed = config["techniques"], config["schedule"]["seed"]
    of, ch = int(techniques["overlong_filter"]), int(techniques["clip_higher"])
    wobble = [0.004, -0.003, 0.002, -0.005, 0.001, 0.003, -0.002, 0.006][of + 2 * ch + 4 * (seed % 2)]
    accuracy = 0.3 + 0.1 * of + 0.2 * ch + wobble
    return {
        "metrics": {"avg@32": accuracy},
        "eval_curve": [{"step": 0, "avg@32": 0.3}, {"step": 2, "avg@32": accuracy}],
        "signals": [{"step": 1, "entropy": 1.0 - 0.1 * ch, "tokens_generated": 10}],
        "tokens_generated": 100, "tokens_discarded": 0, "wall_s": 0.1,
    }  # fmt: skip


def test_report_puts_the_headline_on_the_parent_run(local_ray, tmp_path: Path):
    from mlflow import MlflowClient
    from typer.testing import CliRunner

    from dapo_ablate.ablation.app.report import log_experiment_headline
    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.ablation.runtime.executor import RunOptions, run_experiment
    from dapo_ablate.ablation.store.ledger import SQLLedger
    from dapo_ablate.cli.main import app

    spec_path = write_two_factor_spec(tmp_path, "headline-exp", seeds=2)
    spec = load_spec(spec_path)
    summary = run_experiment(spec, expand(spec), cell_fn=noisy_cell, options=RunOptions(progress=False))
    assert summary.exit_code == 0 and summary.finished == 8

    report = tmp_path / "report"
    result = CliRunner().invoke(app, ["report", str(spec_path), "--out", str(report), "--format", "csv,png,md"])
    assert result.exit_code == 0, result.output
    assert (report / "signals.png").is_file()  # the ledger's per-step signals reach the figure
    assert "Levels (0 / 1): OF off / on; CH off / on." in (report / "report.md").read_text()  # from the spec
    with SQLLedger(spec.ledger) as ledger:
        parent_id = ledger.get_experiment(spec.name).mlflow_parent_run_id
    parent = MlflowClient(spec.tracking.uri).get_run(parent_id)
    metrics = parent.data.metrics
    # full (OF+CH) minus baseline, from the ledger's results: 0.3 and the wobbles cancel to
    # 0.1 + 0.2 + mean(-0.005, 0.006) - mean(0.004, 0.001) = 0.298
    assert metrics["headline/full_vs_baseline"] == pytest.approx(0.298, abs=1e-9)
    assert metrics["headline/ci_low"] < 0.298 < metrics["headline/ci_high"]
    assert metrics["headline/best_cell_avg_at_32"] == pytest.approx(0.6005, abs=1e-9)
    assert parent.data.tags[BEST_CELL_TAG] == "OF+CH"
    assert parent.data.tags[HEADLINE_TAG].startswith("All factors on (OF+CH) vs baseline (all factors off; SP, TL, DS on throughout): +29.8 pp [")
    assert "Headline:" in result.output and "+29.8 pp" in result.output  # the console summary opens with it
    # what `dapo-ablate run` calls at its end: the same numbers, and the sentence back
    assert log_experiment_headline(spec_path).startswith("All factors on (OF+CH) vs baseline (all factors off; SP, TL, DS on throughout): +29.8 pp")


def test_run_ends_with_the_headline_on_the_parent_run(local_ray, tmp_path: Path, monkeypatch):
    from mlflow import MlflowClient
    from typer.testing import CliRunner

    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
    from dapo_ablate.ablation.store.ledger import SQLLedger
    from dapo_ablate.cli.main import app

    spec_path = write_two_factor_spec(tmp_path, "headline-run", seeds=2)
    monkeypatch.setenv(CELL_FN_ENV, "test_headline_e2e:noisy_cell")
    result = CliRunner().invoke(app, ["run", str(spec_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "All factors on (OF+CH) vs baseline (all factors off; SP, TL, DS on throughout): +29.8 pp [" in result.output
    spec = load_spec(spec_path)
    with SQLLedger(spec.ledger) as ledger:
        parent_id = ledger.get_experiment(spec.name).mlflow_parent_run_id
    metrics = MlflowClient(spec.tracking.uri).get_run(parent_id).data.metrics
    assert metrics["headline/full_vs_baseline"] == pytest.approx(0.298, abs=1e-9)
