"""The driver's side of a verl cell: its MLflow child run exists before the cell starts, the cell's
environment names it (verl logs into it), and the driver finishes that run without logging a
second copy of its metrics. verl itself needs GPUs: the cell here is a stand-in that logs verl's
metric names into the run the environment names, as verl's MLflow logger does, and returns the
result a verl cell reads back. The stand-in replaces only the job: the spec is one verl can run (a
job of one GPU, data files the nodes read) and goes through every check a verl run gets, on a local
Ray with one GPU (`Backend.prepare` places the job) whose node has verl's distributions
(`Backend.check_nodes`: `verl_node`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from dapo_ablate.ablation.runtime.pool import MLFLOW_RUN_ENV
from dapo_ablate.ablation.store.tracking import RUN_ID_TAG

from support import restore_environment, rows, run, write_spec
from test_verl_job_shape import fake_verl


LOCAL_RAY_GPUS = 1  # conftest's local_ray: a one-GPU machine, where a verl job of one GPU is placed


@pytest.fixture(scope="module", autouse=True)
def verl_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This machine as a verl node for the node check (before `local_ray` starts: its workers inherit
    the environment): verl's distributions on PYTHONPATH (`test_verl_job_shape.fake_verl`, the
    stand-ins import none of them) and this Python first on PATH, as the jobs' entrypoint needs."""
    site = tmp_path_factory.mktemp("site")
    fake_verl(site)
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "PATH")}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), saved["PYTHONPATH"]]))
    os.environ["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), saved["PATH"]]))
    yield
    restore_environment(saved)


VERL_EXECUTOR = {"gpus_per_run": 1}
VERL_AVG = "val-core/aime-2024/acc/mean_at_32"  # verl's MLflow logger writes @ as _at_


def verl_trainer(folder: Path) -> dict:
    """A verl trainer whose data files exist (tiny parquet files: the node check reads their metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, name in (("train", "dapo-math-17k"), ("eval", "aime-2024")):
        paths[split] = str(folder / f"{name}.parquet")
        pq.write_table(pa.table({"prompt": ["1+1?"], "answer": ["2"]}), paths[split])
    return {"backend": "verl", "model": {"path": "Qwen/Qwen2.5-0.5B"}, "data": paths, "rollout": {"engine": "vllm"}}


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
    spec, summary = run(write_spec(tmp_path, trainer=verl_trainer(tmp_path / "data"), executor=VERL_EXECUTOR), verl_standin_cell)
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


def checkpointing_standin_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """A verl job's checkpoints, as verl 0.9.1 lays them out in the folder our overrides name
    (two saves left by an earlier attempt, two by this one), and a file of the run's own beside them;
    then the stand-in's result. Fails once for the clip_higher cells (their checkpoints must stay
    for the retry to resume from)."""
    folder = Path(run_dir) / "checkpoints"
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    found = sorted(p.name for p in folder.glob("global_step_*")) if folder.exists() else []
    (Path(run_dir) / "found").write_text(",".join(found))  # what this attempt found (a retry: the failed one's)
    for step in (2, 4, 6, 8):
        (folder / f"global_step_{step}" / "actor").mkdir(parents=True, exist_ok=True)
        (folder / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"w" * 64)
    (folder / "latest_checkpointed_iteration.txt").write_text("8")
    attempts = Path(run_dir) / "attempts"
    attempts.write_text(attempts.read_text() + "x" if attempts.exists() else "x")
    if config["techniques"]["clip_higher"] and attempts.read_text() == "x":
        raise RuntimeError("the job failed after its step-8 checkpoint")
    return verl_standin_cell(config, run_dir, eval_cache_dir)


def test_a_done_verl_run_keeps_only_its_final_checkpoint(local_ray, tmp_path):
    executor = {**VERL_EXECUTOR, "checkpoints_when_done": "final", "retries": 1}
    spec, summary = run(write_spec(tmp_path, trainer=verl_trainer(tmp_path / "data"), executor=executor),
                        checkpointing_standin_cell)
    assert summary.exit_code == 0
    for run_id, row in rows(spec).items():
        assert row["status"] == "done"
        folder = Path(spec.output_dir) / spec.name / run_id / "checkpoints"
        assert sorted(p.name for p in folder.iterdir()) == ["global_step_8", "latest_checkpointed_iteration.txt"]
        assert (folder / "global_step_8" / "actor" / "model_world_size_1_rank_0.pt").stat().st_size == 64
        assert (folder.parent / "mlflow_id").exists()  # the run folder's other files are not touched
        found = (folder.parent / "found").read_text()
        assert found in ("", "global_step_2,global_step_4,global_step_6,global_step_8")
        if (folder.parent / "attempts").read_text() == "xx":  # a failed attempt's checkpoints stay for the retry
            assert found == "global_step_2,global_step_4,global_step_6,global_step_8"
    assert sum((Path(spec.output_dir) / spec.name / r / "attempts").read_text() == "xx" for r in rows(spec)) == 2


def test_none_removes_a_done_runs_checkpoints_and_all_leaves_them(local_ray, tmp_path):
    trainer = verl_trainer(tmp_path / "data")
    spec, summary = run(write_spec(tmp_path / "none", trainer=trainer, executor={**VERL_EXECUTOR, "checkpoints_when_done": "none"}),
                        checkpointing_standin_cell)
    assert summary.exit_code == 0
    done = [run_id for run_id, row in rows(spec).items() if row["status"] == "done"]
    assert done and all(not (Path(spec.output_dir) / spec.name / run_id / "checkpoints").exists() for run_id in done)
    spec, _ = run(write_spec(tmp_path / "all", trainer=trainer, executor=VERL_EXECUTOR), checkpointing_standin_cell)  # the default: all
    run_id = next(run_id for run_id, row in rows(spec).items() if row["status"] == "done")
    assert len(list((Path(spec.output_dir) / spec.name / run_id / "checkpoints").glob("global_step_*"))) == 4
