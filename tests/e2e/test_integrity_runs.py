"""Runs: a result kept on disk is recorded only if this product sealed it for that run
(anything else is set aside and the run trains); an experiment name bound to one design refuses
another; every MLflow child carries its params from the moment a rerun can see it; the headline
is logged once and the end of a run rides out a blip. Real Ray tasks with cheap cell functions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from dapo_ablate.ablation.experiment.design import expand
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.runtime.experiment_run import ExperimentRun
from dapo_ablate.ablation.runtime.pool import KEPT_RESULT
from dapo_ablate.ablation.store import transient
from dapo_ablate.ablation.store.binding import DIGEST_TAG, experiment_digest
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.kept_results import ResultKeeper
from dapo_ablate.ablation.store.ledger import LedgerError, SQLLedger
from dapo_ablate.ablation.store.tracking import ROLE_TAG

from support import calls, counting_cell, mlflow_children, rows, run
from support import write_spec as write_executor_spec


TRAINER = {"rollout": {"max_response_len": 32}, "algorithm": {"overlong_cache": 8}}
"""A base trainer whose responses fit the built-in policy's context (the cell functions train nothing)."""


def write_spec(tmp_path: Path, **fields) -> Path:
    return write_executor_spec(tmp_path, **{"trainer": TRAINER, **fields})


@pytest.fixture()
def quick_retries(monkeypatch):
    monkeypatch.setattr(transient, "TRANSIENT_RETRIES", (0.01, 0.01))


def plant(folder: Path, content: str | dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / KEPT_RESULT
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


FORGED = {"metrics": {"avg@32": 0.99}, "eval_curve": [], "signals": [], "tokens_generated": 1, "tokens_discarded": 0,
          "wall_s": 1.0}


def test_planted_kept_results_are_set_aside_and_their_runs_train(local_ray, tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    root, runs = Path(spec.output_dir) / spec.name, expand(spec).runs
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps(FORGED))
    plant(root / runs[0].run_id, FORGED)  # a plain result, as the product once kept them
    plant(root / runs[1].run_id, {**FORGED, "metrics": {}})  # empty metrics: used to make the run done for good
    plant(root / runs[2].run_id, {"format": 1, "run_id": runs[2].run_id, "hmac": "0" * 64, "result": FORGED})
    (root / runs[3].run_id).mkdir(parents=True)
    (root / runs[3].run_id / KEPT_RESULT).symlink_to(outside)
    before = outside.read_bytes()

    _, summary = run(write_spec(tmp_path), counting_cell)
    assert summary.exit_code == 0 and summary.finished == 4
    assert set(calls(spec).values()) == {1}  # every run trained: nothing planted was recorded
    with SQLLedger(spec.ledger) as ledger:
        assert all(record["metrics"]["avg@32"] != 0.99 for record in ledger.results(spec.name))
    assert outside.read_bytes() == before
    for planted in runs:
        folder = root / planted.run_id
        assert not os.path.lexists(folder / KEPT_RESULT)
        assert [path.name for path in folder.iterdir() if path.name.startswith("finished-result")] == [
            "finished-result.set-aside.json"
        ]


def test_a_kept_result_sealed_for_another_run_or_experiment_is_set_aside(local_ray, tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    root, runs = Path(spec.output_dir) / spec.name, expand(spec).runs
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
        key = ledger.result_key(spec.name)
    ResultKeeper(root, key).keep(runs[0].run_id, FORGED)  # a genuine seal, for another run
    (root / runs[1].run_id).mkdir()
    os.replace(root / runs[0].run_id / KEPT_RESULT, root / runs[1].run_id / KEPT_RESULT)
    ResultKeeper(root, bytes(32)).keep(runs[2].run_id, FORGED)  # sealed with another key
    _, summary = run(write_spec(tmp_path), counting_cell)
    assert summary.exit_code == 0 and calls(spec)[runs[1].run_id] == 1 and calls(spec)[runs[2].run_id] == 1
    for run_id in (runs[1].run_id, runs[2].run_id):
        assert (root / run_id / "finished-result.set-aside.json").is_file()


def test_a_result_this_product_kept_is_recorded_without_training(local_ray, tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    root, runs = Path(spec.output_dir) / spec.name, expand(spec).runs
    with SQLLedger(spec.ledger) as ledger:
        ledger.ensure_experiment(spec.name, spec.to_dict(), digest=experiment_digest(spec))
        key = ledger.result_key(spec.name)
    ResultKeeper(root, key).keep(runs[0].run_id, {**FORGED, "metrics": {"avg@32": 0.5, "steps": 3}})
    _, summary = run(write_spec(tmp_path), counting_cell)
    assert summary.exit_code == 0 and calls(spec)[runs[0].run_id] == 0
    assert rows(spec)[runs[0].run_id]["metrics"] == {"avg@32": 0.5, "steps": 3}


def test_another_design_under_a_bound_name_is_refused_before_anything_is_written(local_ray, tmp_path: Path) -> None:
    spec, first = run(write_spec(tmp_path), counting_cell)
    parent = mlflow_parent(spec)
    assert parent.data.tags[DIGEST_TAG] == experiment_digest(spec)
    note = parent.data.tags["mlflow.note.content"]
    for fields in ({"factors": ["soft_overlong", "clip_higher"]}, {"trainer": {**TRAINER, "algorithm": {"overlong_cache": 8, "eps_high": 0.3}}}):
        with pytest.raises(LedgerError, match="another name") as raised:
            run(write_spec(tmp_path, **fields), counting_cell)
        assert "\n" not in str(raised.value)
    assert mlflow_parent(spec).data.tags["mlflow.note.content"] == note
    assert len(mlflow_children(spec)) == 4 and len(rows(spec)) == 4
    more, summary = run(write_spec(tmp_path, seeds=2), counting_cell)  # added seeds keep the name
    assert summary.exit_code == 0 and summary.finished == 4 and summary.already_done == 4


def test_two_ledgers_sharing_an_mlflow_store_cannot_merge_two_designs(local_ray, tmp_path: Path) -> None:
    spec, _ = run(write_spec(tmp_path), counting_cell)
    other = write_spec(tmp_path, ledger=f"sqlite:///{tmp_path / 'other-ledger.db'}", factors=["soft_overlong"])
    with pytest.raises(ExecutorError, match="MLflow") as raised:
        run(other, counting_cell)
    assert "another name" in str(raised.value)
    assert len(mlflow_children(spec)) == 4


def mlflow_parent(spec):
    from mlflow import MlflowClient

    client = MlflowClient(spec.tracking.uri)
    experiment = client.get_experiment_by_name(spec.name)
    (parent,) = client.search_runs([experiment.experiment_id], f"tags.`{ROLE_TAG}` = 'parent'")
    return parent


SETTINGS = [{"name": "slow-lr", "overrides": {"optim.lr": 1.0e-6}}, {"name": "fast-lr", "overrides": {"optim.lr": 1.0e-5}}]


def test_a_stop_between_creating_a_child_and_logging_its_params_leaves_no_child_without_them(
    local_ray, tmp_path: Path, monkeypatch
) -> None:
    from mlflow import MlflowClient

    real_log_batch = MlflowClient.log_batch
    stopped = []

    def stop_in_the_window(self, run_id, metrics=(), params=(), tags=(), *args, **kwargs):
        if not stopped and any(param.key == "seed" for param in params):  # a child's first params
            stopped.append(run_id)
            raise KeyboardInterrupt
        return real_log_batch(self, run_id, metrics, params, tags, *args, **kwargs)

    path = write_spec(tmp_path, settings=SETTINGS)
    monkeypatch.setattr(MlflowClient, "log_batch", stop_in_the_window)
    spec, summary = run(path, counting_cell)
    assert stopped and summary.interrupted
    monkeypatch.setattr(MlflowClient, "log_batch", real_log_batch)
    spec, summary = run(path, counting_cell)
    assert summary.exit_code == 0
    plan = {planned.run_id: planned for planned in expand(spec).runs}
    children = mlflow_children(spec)
    assert set(children) == set(plan) and all(len(found) == 1 for found in children.values())
    for run_id, (child,) in children.items():
        params = child.data.params
        assert params["setting"] == plan[run_id].setting and params["run_id"] == run_id and "seed" in params
        assert child.info.status == "FINISHED"


def test_the_headline_is_logged_once_however_often_a_finished_experiment_is_run(local_ray, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from dapo_ablate.ablation.app.experiment import load_experiment
    from dapo_ablate.ablation.app.experiment import run as run_command
    from dapo_ablate.ablation.runtime.executor import RunOptions

    path = write_spec(tmp_path, seeds=2)
    for _ in range(3):
        outcome = run_command(load_experiment(path), options=RunOptions(progress=False), cell_fn=counting_cell)
        assert outcome.summary.exit_code == 0 and outcome.headline and "no headline" not in outcome.headline
    spec = load_spec(path)
    history = MlflowClient(spec.tracking.uri).get_metric_history(mlflow_parent(spec).info.run_id, "headline/full_vs_baseline")
    assert len(history) == 1


def test_the_end_of_run_reads_ride_out_a_blip(local_ray, tmp_path: Path, monkeypatch, quick_retries) -> None:
    armed, failed = [], []
    real_schedule, real_runs_table, real_results = ExperimentRun._schedule, SQLLedger.runs_table, SQLLedger.results

    def schedule_then_arm(self, *args):
        real_schedule(self, *args)
        armed.append(True)

    def blip_once(real):
        def read(self, name):
            if armed and real.__name__ not in failed:
                failed.append(real.__name__)
                raise LedgerError("could not use the ledger database: server closed the connection") from OperationalError(
                    "SELECT", {}, Exception("server closed the connection unexpectedly"))
            return real(self, name)
        return read

    monkeypatch.setattr(ExperimentRun, "_schedule", schedule_then_arm)
    monkeypatch.setattr(SQLLedger, "runs_table", blip_once(real_runs_table))
    monkeypatch.setattr(SQLLedger, "results", blip_once(real_results))
    spec, summary = run(write_spec(tmp_path), counting_cell)
    assert armed and "runs_table" in failed
    assert summary.exit_code == 0 and len(summary.records) == 4
