"""The slower cases of tests/unit/test_report_mixing.py (a real MLflow store re-logged by a report): in
this tree so the fast tier stays near a minute."""

from __future__ import annotations

import math

from dapo_ablate.ablation.store.tracking import open_tracker
from dapo_ablate.reports.headline import BEST_CELL_TAG, log_parent_headline

from test_report_mixing import FACTORS, results  # noqa: F401, F811 - shared with the fast part


def test_a_headline_without_an_interval_clears_the_earlier_bound(tmp_path):
    tracker = open_tracker(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "artifacts"), "mixed")
    parent = tracker.parent_run(None, name="mixed", tags={}, params={}, digest="d")
    log_parent_headline(tracker, parent, results(2), FACTORS, "avg@32")
    assert math.isfinite(tracker.client.get_run(parent).data.metrics["headline/ci_low"])
    log_parent_headline(tracker, parent, results(1), FACTORS, "avg@32")  # one seed: no interval
    metrics = tracker.client.get_run(parent).data.metrics
    assert math.isnan(metrics["headline/ci_low"]) and math.isnan(metrics["headline/ci_high"])
    assert abs(metrics["headline/full_vs_baseline"] - 0.05) < 1e-12
    assert BEST_CELL_TAG in tracker.client.get_run(parent).data.tags
