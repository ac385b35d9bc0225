"""MLflow tracking of an experiment, on SQLite and on PostgreSQL (fixture `mlflow_uri`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_ablate.ablation.tracking import (
    PARENT_TAG,
    RUN_ID_TAG,
    ChildRun,
    Tracker,
    default_artifact_location,
    flatten,
    metric_name,
)

RESULT = {
    "metrics": {"avg@32": 0.5, "pass@32": 0.75, "maj@32": 0.625, "tokens_trained": 900},
    "eval_curve": [{"step": 0, "avg@32": 0.25, "pass@32": 0.5}, {"step": 2, "avg@32": 0.5, "pass@32": 0.75}],
    "signals": [{"step": 1, "entropy": 1.5, "reward": -0.25}, {"step": 2, "entropy": 1.25, "reward": 0.0}],
    "tokens_generated": 1200,
    "tokens_discarded": 300,
    "wall_s": 4.5,
}
CONFIG = {"techniques": {"clip_higher": True, "overlong_filter": False}, "algorithm": {"eps_high": 0.28}}


def child(run_id: str = "r1", name: str = "CH s0") -> ChildRun:
    return ChildRun(
        run_id=run_id, name=name, factors={"overlong_filter": 0, "clip_higher": 1}, seed=0,
        config=CONFIG, result=RESULT, tags={"dapo.design": "full", "dapo.cell": "01"},
    )


@pytest.fixture
def tracker(mlflow_uri: str, tmp_path: Path) -> Tracker:
    return Tracker(mlflow_uri, (tmp_path / "artifacts").as_uri(), "exp")


def test_names_and_flattening():
    assert metric_name("avg@32") == "avg_at_32"
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": None}


def test_default_artifact_location(tmp_path: Path):
    assert default_artifact_location(f"sqlite:///{tmp_path}/m/mlflow.db", "out") == (tmp_path / "m" / "mlartifacts").as_uri()
    assert default_artifact_location("postgresql://u@h/db", tmp_path) == (tmp_path / "mlartifacts").as_uri()
    assert default_artifact_location("http://mlflow.example:5000", tmp_path) is None


def test_parent_run_is_created_once_and_found_again(tracker: Tracker, mlflow_uri: str, tmp_path: Path):
    parent = tracker.parent_run(None, name="exp", tags={"dapo.design": "full"})
    assert tracker.parent_run(parent, name="exp", tags={}) == parent
    # A new driver that lost the ledger's record still finds it by its tag.
    again = Tracker(mlflow_uri, (tmp_path / "elsewhere").as_uri(), "exp")
    assert again.experiment_id == tracker.experiment_id
    assert again.parent_run(None, name="exp", tags={"dapo.design": "half"}) == parent
    assert tracker.client.get_run(parent).data.tags["dapo.design"] == "half"
    assert len(tracker.client.search_runs([tracker.experiment_id])) == 1


def test_child_run_shows_params_curves_metrics_tags_and_config(tracker: Tracker):
    parent = tracker.parent_run(None, name="exp", tags={})
    run_id = tracker.log_child(parent, child())
    run = tracker.client.get_run(run_id)
    assert run.info.run_name == "CH s0" and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags[PARENT_TAG] == parent and tags[RUN_ID_TAG] == "r1" and tags["dapo.cell"] == "01"
    params = run.data.params
    assert params["factor.clip_higher"] == "1" and params["factor.overlong_filter"] == "0"
    assert params["algorithm.eps_high"] == "0.28" and params["techniques.clip_higher"] == "True"
    assert params["seed"] == "0" and params["run_id"] == "r1"
    metrics = run.data.metrics
    assert metrics["avg_at_32"] == 0.5 and metrics["maj_at_32"] == 0.625
    assert metrics["tokens_generated"] == 1200 and metrics["wall_s"] == 4.5
    entropy = tracker.client.get_metric_history(run_id, "train/entropy")
    assert [(m.step, m.value) for m in entropy] == [(1, 1.5), (2, 1.25)]
    curve = tracker.client.get_metric_history(run_id, "eval/avg_at_32")
    assert sorted((m.step, m.value) for m in curve) == [(0, 0.25), (2, 0.5)]
    local = tracker.client.download_artifacts(run_id, "config.json")
    assert json.loads(Path(local).read_text()) == CONFIG


def test_logging_a_child_again_reuses_it(tracker: Tracker):
    parent = tracker.parent_run(None, name="exp", tags={})
    first = tracker.log_child(parent, child())
    assert tracker.log_child(parent, child()) == first
    assert tracker.finished_children(parent) == {"r1": first}


def test_a_half_logged_child_is_replaced(tracker: Tracker):
    parent = tracker.parent_run(None, name="exp", tags={})
    # What a driver killed while logging leaves behind: a RUNNING child with the run id tag.
    stale = tracker.client.create_run(
        tracker.experiment_id, run_name="CH s0", tags={PARENT_TAG: parent, RUN_ID_TAG: "r1"}
    ).info.run_id
    assert tracker.finished_children(parent) == {}
    logged = tracker.log_child(parent, child())
    assert logged != stale
    active = tracker.client.search_runs([tracker.experiment_id], f"tags.`{RUN_ID_TAG}` = 'r1'")
    assert [run.info.run_id for run in active] == [logged]


def test_children_of_another_parent_are_not_reused(tracker: Tracker, mlflow_uri: str, tmp_path: Path):
    parent = tracker.parent_run(None, name="exp", tags={})
    other = Tracker(mlflow_uri, (tmp_path / "other").as_uri(), "other-exp")
    other_parent = other.parent_run(None, name="other-exp", tags={})
    mine, theirs = tracker.log_child(parent, child()), other.log_child(other_parent, child())
    assert mine != theirs
    assert tracker.finished_children(parent) == {"r1": mine}


def test_a_long_run_is_logged_in_batches_within_mlflows_limits(tracker: Tracker):
    # 150 params and 2 x 700 signal values: more than one log_batch call may take.
    config = {"section": {f"knob_{i}": i for i in range(150)}}
    signals = [{"step": step, "entropy": 1.0 / step, "reward": 0.0} for step in range(1, 701)]
    long_run = ChildRun("r-long", "GRPO s0", {"clip_higher": 0}, 0, config, {**RESULT, "signals": signals})
    parent = tracker.parent_run(None, name="exp", tags={})
    run_id = tracker.log_child(parent, long_run)
    run = tracker.client.get_run(run_id)
    assert run.data.params["section.knob_149"] == "149"
    assert len(tracker.client.get_metric_history(run_id, "train/reward")) == 700
    assert len(tracker.client.get_metric_history(run_id, "train/entropy")) == 700
