"""Predict, then confirm: a report writes predictions.yaml; a later report given it says term by
term confirmed / contradicted / inconclusive, with the rank agreement of the effects."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from dapo_ablate.core.contracts import SettingInfo
from dapo_ablate.reports import analyze, write_report
from dapo_ablate.reports.predictions import (
    CONFIRMATION_COLUMNS,
    Prediction,
    confirm_predictions,
    kendall_tau,
    load_predictions,
    predictions_data,
)
from dapo_ablate.reports.simulate import simulate_results
from dapo_ablate.reports.table import ReportInputError
from dapo_ablate.reports.verdicts import direction_verdict, setting_matches

FACTORS = ["overlong_filter", "clip_higher", "dynamic_sampling"]
NAN2 = (float("nan"), float("nan"))


def test_direction_verdict_by_hand():
    # positive predicted: [0.01, 0.05] excludes zero above -> confirmed; [-0.05, -0.01] below -> contradicted
    assert direction_verdict("positive", 0.01, 0.05, NAN2, 0.02) == "confirmed"
    assert direction_verdict("positive", -0.05, -0.01, NAN2, 0.02) == "contradicted"
    assert direction_verdict("negative", -0.05, -0.01, NAN2, 0.02) == "confirmed"
    assert direction_verdict("positive", -0.01, 0.05, NAN2, 0.02) == "inconclusive"
    # zero predicted: the (1 - 2 alpha) interval [-0.01, 0.015] inside +-0.02 -> confirmed; never contradicted
    assert direction_verdict("zero", -0.02, 0.02, (-0.01, 0.015), 0.02) == "confirmed"
    assert direction_verdict("zero", 0.05, 0.09, (0.055, 0.085), 0.02) == "inconclusive"
    assert direction_verdict("positive", float("nan"), float("nan"), NAN2, 0.02) == "not enough data"


def test_kendall_tau_matches_scipy():
    from scipy import stats

    x, y = np.array([0.3, 0.1, 0.2, 0.5]), np.array([0.2, 0.0, 0.4, 0.6])
    assert kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)


def test_setting_matching_reads_only_the_stated_attributes():
    info = SettingInfo("s", "qwen2.5", "7B", "instruct", "dapo-math-17k", 20480)
    assert setting_matches({}, info)
    assert setting_matches({"model_type": "Instruct", "model_size": ["4B", "7b"]}, info)
    assert not setting_matches({"model_type": "base"}, info)
    assert not setting_matches({"model_family": "qwen3"}, SettingInfo("unknown"))  # unknown never matches a stated value


def _report(tmp_path, name, planted, seed, **options):
    results = simulate_results(FACTORS, 0.4, planted, seeds=3, noise_sd=0.01, rng=seed)
    write_report(results, FACTORS, tmp_path / name, formats=["csv", "md"], **options)
    return tmp_path / name


def test_small_effect_confirmed_large_and_a_flip_contradicted(tmp_path):
    first = _report(tmp_path, "first", {("clip_higher",): 0.02, ("dynamic_sampling",): 0.08}, seed=1)
    data = yaml.safe_load((first / "predictions.yaml").read_text())
    main = {p["term"]: p for p in data["predictions"] if p["statistic"] == "main"}
    assert main["clip_higher"]["direction"] == "positive" and main["dynamic_sampling"]["direction"] == "positive"
    second = _report(tmp_path, "second", {("clip_higher",): 0.10, ("dynamic_sampling",): -0.08}, seed=2,
                     predictions=str(first / "predictions.yaml"))
    table = pd.read_csv(second / "confirmation.csv")
    assert list(table.columns) == CONFIRMATION_COLUMNS
    verdict = table[table["statistic"] == "main"].set_index("term")["verdict"]
    assert verdict["clip_higher"] == "confirmed"  # measured +2 pp, now +10 pp: the direction is what is confirmed
    assert verdict["dynamic_sampling"] == "contradicted"
    assert verdict["overlong_filter"] in ("confirmed", "inconclusive")  # a null stays a null
    page = (second / "report.md").read_text()
    ranks = pd.read_csv(second / "prediction_ranks.csv")
    assert ranks.loc[0, "n_terms"] == 3 and ranks.loc[0, "ci_low"] <= ranks.loc[0, "kendall_tau"] <= ranks.loc[0, "ci_high"]
    assert "seeds resampled" in ranks.loc[0, "method"]
    for row in table.itertuples(index=False):  # one verdict, the same on the page as in the CSV
        assert f": {row.verdict}." in page
    assert page.count(": contradicted.") == int((table["verdict"] == "contradicted").sum())


def _null_verdicts(seed: int) -> list[str]:
    """Two experiments of two factors with no effect at all; the second confirms the first."""
    factors = FACTORS[:2]
    first = analyze(simulate_results(factors, 0.4, {}, seeds=3, noise_sd=0.01, rng=seed), factors)
    second = analyze(simulate_results(factors, 0.4, {}, seeds=3, noise_sd=0.01, rng=10_000 + seed), factors)
    rows = predictions_data({"a": first}, {}, None)["predictions"]
    predictions = [Prediction(**{**row, "from_setting": row["from_setting"], "for_setting": {}}) for row in rows]
    return list(confirm_predictions(predictions, {"b": second}, {}, {}, 0.02).table["verdict"])


def test_a_file_that_is_not_predictions_is_one_sentence(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("format: something else\n")
    with pytest.raises(ReportInputError, match="is not a predictions file"):
        load_predictions(path, "avg@32")
    path.write_text(yaml.safe_dump({"format": "dapo-ablate predictions 1", "metric": "pass@32", "predictions": []}))
    with pytest.raises(ReportInputError, match="predicts 'pass@32'"):
        load_predictions(path, "avg@32")
