"""The end-to-end tests (Ray, `dapo-ablate` processes, training) of what tests/unit/test_tracking.py
describes; its docstring says what they check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo_ablate.ablation.store.runs_view import (
    RUNS_VIEW_KEY,
    SHARED_VIEW_PREFIX,
    RunsView,
    metric_column,
    param_column,
    save_runs_view,
)
from dapo_ablate.ablation.store.tracking import (
    EXPERIMENT_KIND_TAG,
    GIT_COMMIT_TAG,
    PARENT_TAG,
    RUN_ID_TAG,
    TRAINING_KIND,
    VERSION_TAG,
    ChildRun,
    Tracker,
    default_artifact_location,
)

from support import ROOT

RESULT = {
    "metrics": {"avg@32": 0.5, "pass@32": 0.75, "maj@32": 0.625, "tokens_trained": 900},
    "eval_curve": [{"step": 0, "avg@32": 0.25, "pass@32": 0.5}, {"step": 2, "avg@32": 0.5, "pass@32": 0.75}],
    "signals": [{"step": 1, "entropy": 1.5, "reward": -0.25, "clipfrac_low": 0.125, "clipfrac_high": 0.25},
                {"step": 2, "entropy": 1.25, "reward": 0.0}],
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
    assert metrics["val-core/builtin/acc/mean_at_32"] == 0.5 and metrics["val-core/builtin/acc/maj_at_32/mean"] == 0.625
    assert metrics["val-core/builtin/acc/best_at_32/mean"] == 0.75
    assert metrics["perf/tokens_generated"] == 1200 and metrics["perf/wall_s"] == 4.5
    assert metrics["perf/tokens_trained"] == 900 and metrics["actor/pg_clipfrac"] == 0.375
    entropy = tracker.client.get_metric_history(run_id, "actor/entropy")
    assert [(m.step, m.value) for m in entropy] == [(1, 1.5), (2, 1.25)]
    curve = tracker.client.get_metric_history(run_id, "val-core/builtin/acc/mean_at_32")
    assert sorted((m.step, m.value) for m in curve) == [(0, 0.25), (2, 0.5)]  # the final one is not logged twice
    assert not any(key.startswith(("avg", "eval/", "train/entropy")) for key in metrics)
    assert tags[VERSION_TAG] and tags["mlflow.source.name"] == "dapo-ablate"
    local = tracker.client.download_artifacts(run_id, "config.json")
    assert json.loads(Path(local).read_text()) == CONFIG


def test_logging_a_child_again_reuses_it(tracker: Tracker):
    parent = tracker.parent_run(None, name="exp", tags={})
    first = tracker.log_child(parent, child())
    assert tracker.log_child(parent, child()) == first
    assert tracker.finished_children(parent) == {"r1": first}


def test_a_half_logged_child_is_continued_without_duplicates(tracker: Tracker):
    parent = tracker.parent_run(None, name="exp", tags={})
    # What a driver killed while its run trained leaves behind: a RUNNING child with some steps.
    started = tracker.start_child(parent, ChildRun("r1", "CH s0", {"clip_higher": 1}, 0, CONFIG))
    tracker.log_event(started, "step", 1, RESULT["signals"][0])
    assert tracker.finished_children(parent) == {}
    again = Tracker(tracker.uri, None, "exp")  # the next driver
    logged = again.log_child(parent, child())
    assert logged == started
    active = tracker.client.search_runs([tracker.experiment_id], f"tags.`{RUN_ID_TAG}` = 'r1'")
    assert [run.info.run_id for run in active] == [logged] and active[0].info.status == "FINISHED"
    assert [m.step for m in tracker.client.get_metric_history(logged, "actor/entropy")] == [1, 2]


def test_a_child_is_live_while_it_trains_and_ends_with_its_status(tracker: Tracker):
    parent = tracker.parent_run(None, name="exp", tags={})
    live = tracker.start_child(parent, ChildRun("r2", "GRPO s0", {"clip_higher": 0}, 0, CONFIG))
    assert tracker.client.get_run(live).info.status == "RUNNING"
    assert tracker.log_event(live, "eval", 0, {"step": 0, "avg@32": 0.25, "response_length": 30.0}) == 2
    assert tracker.log_event(live, "step", 1, {"step": 1, "entropy": 1.5, "truncation_rate": 0.125}) == 2
    assert tracker.log_event(live, "step", 1, {"step": 1, "entropy": 1.5}) == 0  # a resumed run re-sends it
    metrics = tracker.client.get_run(live).data.metrics
    assert metrics == {"val-core/builtin/acc/mean_at_32": 0.25, "val-aux/builtin/response_length/mean": 30.0,
                       "actor/entropy": 1.5, "response_length/clip_ratio": 0.125}
    tracker.end_child(live, "FAILED")
    assert tracker.client.get_run(live).info.status == "FAILED"
    assert tracker.start_child(parent, ChildRun("r2", "GRPO s0", {"clip_higher": 0}, 0, CONFIG)) == live  # retried
    assert tracker.client.get_run(live).info.status == "RUNNING"
    tracker.end_child(live, "KILLED")
    assert tracker.client.get_run(live).info.status == "KILLED"


def test_experiment_kind_and_source_tags(tracker: Tracker, mlflow_uri: str):
    assert tracker.client.get_experiment(tracker.experiment_id).tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND
    parent = tracker.parent_run(None, name="exp", tags={"mlflow.note.content": "design full"},
                                params={"design": "full", "seeds": "0,1"})
    run = tracker.client.get_run(parent)
    assert run.data.tags[VERSION_TAG] and run.data.tags["mlflow.note.content"] == "design full"
    assert run.data.params == {"design": "full", "seeds": "0,1"}
    if (ROOT / ".git").exists():
        assert len(run.data.tags[GIT_COMMIT_TAG]) == 40
    # A rerun with a changed spec: params are immutable in MLflow, so the first values stay.
    assert tracker.parent_run(parent, name="exp", tags={}, params={"design": "half", "runs": 8}) == parent
    assert tracker.client.get_run(parent).data.params == {"design": "full", "seeds": "0,1", "runs": "8"}


def test_a_copied_store_writes_only_into_the_copy(tmp_path: Path):
    original = tmp_path / "a" / "dapo-runs"
    uri = f"sqlite:///{original}/mlflow.db"
    first = Tracker(uri, default_artifact_location(uri, original), "exp")
    parent = first.parent_run(None, name="exp", tags={})
    first.log_child(parent, child())
    import shutil

    copy = tmp_path / "b" / "dapo-runs"
    shutil.copytree(original, copy)
    shutil.rmtree(original / "mlartifacts")
    moved = Tracker(f"sqlite:///{copy}/mlflow.db", None, "exp")
    moved.log_dict(parent, {"x": 1}, "report/x.json")
    assert (copy / "mlartifacts").is_dir() and not (original / "mlartifacts").exists()
    assert moved.client.get_run(parent).info.artifact_uri.startswith((copy / "mlartifacts").as_uri())
    local = moved.client.download_artifacts(moved.log_child(parent, child()), "config.json")
    assert Path(local).read_text() and str(copy) in moved.client.get_experiment(moved.experiment_id).artifact_location


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
    assert len(tracker.client.get_metric_history(run_id, "critic/score/mean")) == 700
    assert len(tracker.client.get_metric_history(run_id, "actor/entropy")) == 700


def test_an_experiment_made_without_the_kind_tag_gets_it_when_opened(mlflow_uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    experiment_id = client.create_experiment("older")  # as an earlier version, or another tool, made it
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(experiment_id).tags
    assert Tracker(mlflow_uri, None, "older").experiment_id == experiment_id
    assert client.get_experiment(experiment_id).tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND


def test_the_runs_view_is_saved_as_the_uis_shared_view(mlflow_uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(mlflow_uri)
    experiment_id = client.create_experiment("older")
    metric = "val-core/builtin/acc/mean_at_32"
    columns = (metric_column(metric), param_column("factor.clip_higher"), metric_column("headline/full_vs_baseline"))
    view = RunsView("dapo-ablate: runs by avg@32", metric, columns, {metric_column(metric): 220})
    assert save_runs_view(mlflow_uri, "older", view) == experiment_id
    tags = client.get_experiment(experiment_id).tags
    assert tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND  # an experiment without the tag gets it here too
    # the envelope MLflow's UI reads a saved view from: name, createdAt (ms), state as a JSON string
    envelope = json.loads(tags[SHARED_VIEW_PREFIX + RUNS_VIEW_KEY])
    assert envelope["name"] == "dapo-ablate: runs by avg@32" and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["orderByKey"] == "metrics.`val-core/builtin/acc/mean_at_32`" and state["orderByAsc"] is False
    assert state["selectedColumns"] == state["columnOrder"] == [
        "metrics.`val-core/builtin/acc/mean_at_32`", "params.`factor.clip_higher`", "metrics.`headline/full_vs_baseline`"]
    assert state["columnWidths"] == {"metrics.`val-core/builtin/acc/mean_at_32`": 220}
    # saved again (each `ui`): the same view, its first save time kept
    again = RunsView("dapo-ablate: runs by avg@32", metric, columns[:2])
    assert save_runs_view(mlflow_uri, "older", again) == experiment_id
    second = json.loads(client.get_experiment(experiment_id).tags[SHARED_VIEW_PREFIX + RUNS_VIEW_KEY])
    assert second["createdAt"] == envelope["createdAt"] and second["updatedAt"] >= envelope["updatedAt"]
    assert json.loads(second["state"])["selectedColumns"] == list(columns[:2])
    # no experiment of that name: nothing is written, nothing created
    assert save_runs_view(mlflow_uri, "nobody", view) is None
    assert client.get_experiment_by_name("nobody") is None


def test_report_on_a_copied_store_logs_into_the_copy(tmp_path: Path):
    import shutil

    from dapo_ablate.ablation.store.results import ParentRunLogger

    original = tmp_path / "a" / "dapo-runs"
    uri = f"sqlite:///{original}/mlflow.db"
    parent = Tracker(uri, default_artifact_location(uri, original), "exp").parent_run(None, name="exp", tags={})
    copy = tmp_path / "b" / "dapo-runs"
    shutil.copytree(original, copy)
    report = tmp_path / "report"
    report.mkdir()
    (report / "summary.md").write_text("# report\n")
    ParentRunLogger(f"sqlite:///{copy}/mlflow.db", parent).log_artifacts(str(report), "report")
    assert list((copy / "mlartifacts").rglob("summary.md")) and not list(original.rglob("summary.md"))
