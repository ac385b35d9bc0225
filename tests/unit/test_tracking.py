"""MLflow tracking of an experiment, on SQLite and on PostgreSQL (fixture `mlflow_uri`).

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_tracking_e2e.py."""

from __future__ import annotations

from pathlib import Path

from dapo_ablate.ablation.store.metric_names import eval_name, eval_source, step_name
from dapo_ablate.ablation.store.runs_view import (
    runs_page_link,
)
from dapo_ablate.ablation.store.tracking import (
    default_artifact_location,
    flatten,
    metric_name,
)


def test_names_and_flattening():
    assert metric_name("avg@32") == "avg_at_32"
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": None}


def test_default_artifact_location(tmp_path: Path):
    assert default_artifact_location(f"sqlite:///{tmp_path}/m/mlflow.db", "out") == (tmp_path / "m" / "mlartifacts").as_uri()
    assert default_artifact_location("postgresql://u@h/db", tmp_path) == (tmp_path / "mlartifacts").as_uri()
    assert default_artifact_location("http://mlflow.example:5000", tmp_path) is None


def test_names_follow_verl():
    assert step_name("truncation_rate") == "response_length/clip_ratio" and step_name("approx_kl") == "actor/ppo_kl"
    assert step_name("time_rollout_s") == "timing_s/gen" and step_name("groups_kept") == "train/groups_kept"
    assert eval_name("pass@16", "aime-2024") == "val-core/aime-2024/acc/best_at_16/mean"
    assert eval_source({"data": {"eval": "/data/aime-2024.jsonl"}}) == "aime-2024"
    assert eval_source({"data": {}}) == "builtin"


def test_the_runs_page_link_opens_the_training_workflow_with_the_view():
    assert runs_page_link("http://127.0.0.1:5000", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=dapo-ablate")
    assert runs_page_link("http://127.0.0.1:5000", None) == "http://127.0.0.1:5000/#/experiments?workflowType=machine_learning"
