"""The headline (full vs baseline with its interval, the best cells) and its MLflow parent metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from dapo_ablate.reports import analyze
from dapo_ablate.reports.headline import BEST_CELL_TAG, HEADLINE_TAG, headline, headline_lines, headline_metrics

# Cell means (a, b) -> value; seed effects; a fixed "noise" per run so the residuals are known.
MEANS = {(0, 0): 0.30, (1, 0): 0.40, (0, 1): 0.35, (1, 1): 0.50}
SEED_EFFECT = {0: 0.01, 1: 0.0, 2: -0.01}
NOISE = [0.004, -0.002, -0.002, -0.003, 0.001, 0.002, 0.005, -0.004, -0.001, -0.006, 0.005, 0.001]


def two_factor_results(means=MEANS) -> pd.DataFrame:
    rows = []
    for i, ((a, b), mean) in enumerate((cell, m) for cell, m in means.items() for _ in range(3)):
        seed = i % 3
        rows.append({"a": a, "b": b, "seed": seed, "avg@32": mean + SEED_EFFECT[seed] + NOISE[i]})
    return pd.DataFrame(rows)


def test_full_vs_baseline_by_hand():
    results = two_factor_results()
    h = headline(analyze(results, ["a", "b"]))
    # Balanced cells x seeds: the cell means are the plain means; the residual is the two-way
    # (cell x seed) interaction. Each cell keeps its own variance s_j^2 = sum_s res_js^2 / nu,
    # nu = (3 - 1)(4 - 1) / 4 = 1.5 df; Var(full - baseline) = (s_full^2 + s_base^2) / 3 on
    # Welch-Satterthwaite df (a + b)^2 / ((a^2 + b^2) / nu), a = s_full^2 / 3, b = s_base^2 / 3.
    table = results.assign(cell=results["a"] + 2 * results["b"]).pivot(index="cell", columns="seed", values="avg@32")
    y = table.to_numpy()
    residual = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    s2 = (residual**2).sum(axis=1) / 1.5
    a, b = s2[3] / 3, s2[0] / 3
    gain = y[3].mean() - y[0].mean()
    half = stats.t.ppf(0.975, (a + b) ** 2 / ((a**2 + b**2) / 1.5)) * np.sqrt(a + b)
    assert h.gain.estimate == pytest.approx(gain, abs=1e-12)
    assert (h.gain.ci_low, h.gain.ci_high) == pytest.approx((gain - half, gain + half), abs=1e-12)
    assert h.full_mean == pytest.approx(y[3].mean()) and h.baseline_mean == pytest.approx(y[0].mean())
    assert h.full_name == "all factors on (a+b)" and h.baseline_name == "baseline (all off)"
    assert [cell.label for cell in h.best] == ["a+b", "a", "b"] and h.best[0].is_full and not h.beat_full
    lines = headline_lines(h)
    assert lines[0].startswith(f"All factors on (a+b) vs baseline (all off): +{100 * gain:.1f} pp [")
    assert len(lines) == 2  # nothing beats the full cell


def test_a_cell_above_full_is_named_with_its_comparison():
    results = two_factor_results({**MEANS, (1, 0): 0.56})
    h = headline(analyze(results, ["a", "b"]))
    assert h.best[0].label == "a" and [cell.label for cell in h.beat_full] == ["a"]
    assert h.above_full == 1 and h.n_cells == 4
    diff = h.best[0].vs_full
    assert diff.estimate == pytest.approx(0.06, abs=0.01) and diff.excludes_zero
    assert "1 of 4 cells have a higher mean than all factors on (a+b)" in headline_lines(h)[2]


def test_paper_factors_name_full_dapo_and_grpo():
    from dapo_ablate.reports import PAPER_FACTORS
    from dapo_ablate.reports.simulate import simulate_results

    results = simulate_results(list(PAPER_FACTORS), 0.30, {("dynamic_sampling",): 0.1}, seeds=2, rng=0)
    line = headline_lines(headline(analyze(results, list(PAPER_FACTORS))))[0]
    assert line.startswith("Full DAPO (OF+CH+SP+TL+DS) vs GRPO: +")


def test_a_design_without_the_full_cell_has_no_gain():
    results = two_factor_results()
    partial = results[~((results["a"] == 1) & (results["b"] == 1))]
    h = headline(analyze(partial, ["a", "b"]))
    assert np.isnan(h.gain.estimate) and "not estimable" in headline_lines(h)[0]
    assert "headline/full_vs_baseline" not in headline_metrics(h)  # NaN is not logged



def write_two_factor_spec(tmp_path: Path, name: str, seeds: int) -> Path:
    """A spec over OF and CH whose stores and outputs live under tmp_path/out."""
    out = tmp_path / "out"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": name, "trainer": {}, "factors": ["overlong_filter", "clip_higher"], "seeds": seeds,
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
    }))  # fmt: skip
    return spec_path

def test_no_headline_before_anything_finished(tmp_path: Path):
    from dapo_ablate.ablation.app.report import log_experiment_headline

    out, spec_path = tmp_path / "out", write_two_factor_spec(tmp_path, "nothing-yet", seeds=1)
    assert log_experiment_headline(spec_path).startswith("no headline: experiment 'nothing-yet' has no ledger")
    assert not out.exists()  # reading creates nothing


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

    from dapo_ablate.ablation.experiment.design import expand
    from dapo_ablate.ablation.runtime.executor import RunOptions, run_experiment
    from dapo_ablate.ablation.store.ledger import SQLLedger
    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.cli.main import app
    from dapo_ablate.ablation.app.report import log_experiment_headline

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
    assert parent.data.tags[HEADLINE_TAG].startswith("All factors on (OF+CH) vs baseline (all off): +29.8 pp [")
    assert "Headline:" in result.output and "+29.8 pp" in result.output  # the console summary opens with it
    # what `dapo-ablate run` calls at its end: the same numbers, and the sentence back
    assert log_experiment_headline(spec_path).startswith("All factors on (OF+CH) vs baseline (all off): +29.8 pp")


def test_run_ends_with_the_headline_on_the_parent_run(local_ray, tmp_path: Path, monkeypatch):
    from mlflow import MlflowClient
    from typer.testing import CliRunner

    from dapo_ablate.ablation.runtime.task import CELL_FN_ENV
    from dapo_ablate.ablation.store.ledger import SQLLedger
    from dapo_ablate.ablation.experiment.spec import load_spec
    from dapo_ablate.cli.main import app

    spec_path = write_two_factor_spec(tmp_path, "headline-run", seeds=2)
    monkeypatch.setenv(CELL_FN_ENV, "test_headline:noisy_cell")
    result = CliRunner().invoke(app, ["run", str(spec_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "All factors on (OF+CH) vs baseline (all off): +29.8 pp [" in result.output
    spec = load_spec(spec_path)
    with SQLLedger(spec.ledger) as ledger:
        parent_id = ledger.get_experiment(spec.name).mlflow_parent_run_id
    metrics = MlflowClient(spec.tracking.uri).get_run(parent_id).data.metrics
    assert metrics["headline/full_vs_baseline"] == pytest.approx(0.298, abs=1e-9)
