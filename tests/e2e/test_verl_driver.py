"""The driver's side of a verl cell: its MLflow child run exists before the cell starts, the cell's
environment names it (verl logs into it), and the driver finishes that run without logging a
second copy of its metrics. verl itself needs GPUs: the cell here is a stand-in that logs verl's
metric names into the run the environment names, as verl's MLflow logger does, and returns the
result a verl cell reads back."""

from __future__ import annotations

import os
from pathlib import Path

import mlflow

from dapo_ablate.ablation.runtime.pool import MLFLOW_RUN_ENV
from dapo_ablate.ablation.store.tracking import RUN_ID_TAG

from support import rows, run, write_spec


VERL_TRAINER = {
    "backend": "verl",
    "model": {"path": "Qwen/Qwen2.5-0.5B"},
    "data": {"train": "/cluster/data/dapo-math-17k.parquet", "eval": "/cluster/data/aime-2024.parquet"},
}
VERL_AVG = "val-core/aime-2024/acc/mean_at_32"  # verl's MLflow logger writes @ as _at_


def verl_standin_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """What a verl job does to MLflow (log into the run it is given) and what reading it back gives."""
    client = mlflow.MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    mlflow_id = os.environ[MLFLOW_RUN_ENV]
    accuracy = 0.3 + 0.2 * config["techniques"]["clip_higher"]
    for step, value in ((0, 0.3), (4, accuracy)):
        client.log_metric(mlflow_id, VERL_AVG, value, step=step)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "mlflow_id").write_text(mlflow_id)
    return {"metrics": {"avg@32": accuracy}, "eval_curve": [{"step": 0, "avg@32": 0.3}, {"step": 4, "avg@32": accuracy}],
            "signals": [], "tokens_generated": 0, "tokens_discarded": 0, "wall_s": 1.0}


def test_a_verl_cell_logs_into_the_child_the_driver_made_and_nothing_twice(local_ray, tmp_path):
    spec, summary = run(write_spec(tmp_path, trainer=VERL_TRAINER), verl_standin_cell)
    assert summary.exit_code == 0
    client = mlflow.MlflowClient(spec.tracking.uri)
    experiment = client.get_experiment_by_name(spec.name)
    children = [r for r in client.search_runs([experiment.experiment_id]) if RUN_ID_TAG in r.data.tags]
    assert len(children) == len(rows(spec)) == 4
    for child in children:
        run_id = child.data.tags[RUN_ID_TAG]
        # the run the cell logged into is the driver's child of that run, recorded in the ledger
        assert (Path(spec.output_dir) / spec.name / run_id / "mlflow_id").read_text() == child.info.run_id
        assert rows(spec)[run_id]["mlflow_run_id"] == child.info.run_id
        assert child.info.status == "FINISHED"
        history = client.get_metric_history(child.info.run_id, VERL_AVG)
        assert sorted(point.step for point in history) == [0, 4]  # verl's two points, no second copy
        assert set(child.data.metrics) == {VERL_AVG}  # the driver logged nothing of its own into it


def test_status_shows_the_ray_job_of_cells_run_as_jobs(local_ray, tmp_path):
    from support import counting_cell
    from typer.testing import CliRunner

    from dapo_ablate.ablation.store.ledger import SQLLedger
    from dapo_ablate.cli.main import app

    path = write_spec(tmp_path)
    spec, _ = run(path, counting_cell)
    runner = CliRunner()
    plain = runner.invoke(app, ["status", str(path)], env={"COLUMNS": "200"})
    assert plain.exit_code == 0 and "dapo-ablate-exp-" not in plain.output  # no job column without jobs
    run_id = next(iter(rows(spec)))
    with SQLLedger(spec.ledger) as ledger:
        ledger.set_job_id(run_id, f"dapo-ablate-exp-{run_id}-a1")
    shown = runner.invoke(app, ["status", str(path)], env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and f"dapo-ablate-exp-{run_id}-a1" in shown.output.replace("\n", "").replace(" ", "").replace("│", "")
