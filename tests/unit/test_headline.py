"""The headline (full vs baseline with its interval, the best cells) and its MLflow parent metrics.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_headline_e2e.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from dapo_ablate.reports import analyze
from dapo_ablate.reports.headline import headline, headline_lines, headline_metrics

from support import STAND_IN_CELL_TRAINER


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


def write_two_factor_spec(tmp_path: Path, name: str, seeds: int) -> Path:
    """A spec over OF and CH whose stores and outputs live under tmp_path/out; its runs are played by
    stand-in cells (a trainer config that passes the context check, never trained)."""
    out = tmp_path / "out"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": name, "trainer": STAND_IN_CELL_TRAINER, "factors": ["overlong_filter", "clip_higher"], "seeds": seeds,
        "output_dir": str(out), "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
    }))  # fmt: skip
    return spec_path


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


def test_no_headline_before_anything_finished(tmp_path: Path):
    from dapo_ablate.ablation.app.report import log_experiment_headline

    out, spec_path = tmp_path / "out", write_two_factor_spec(tmp_path, "nothing-yet", seeds=1)
    assert log_experiment_headline(spec_path).startswith("no headline: experiment 'nothing-yet' has no ledger")
    assert not out.exists()  # reading creates nothing
