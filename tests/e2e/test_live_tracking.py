"""Live MLflow: a real run (the built-in policy, through `dapo-ablate run`, Ray and the driver)
is read from the MLflow store while it is still training."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dapo_ablate.ablation.store.tracking import EXPERIMENT_KIND_TAG, RUN_ID_TAG, TRAINING_KIND, VERSION_TAG

from tiny_configs import TINY_TRAINER
from support import HANG_GUARD_S


COMMAND = str(Path(sys.executable).parent / "dapo-ablate")
LONG_TRAINER = {**TINY_TRAINER, "schedule": {"total_steps": 400, "eval_every": 0}}  # far longer than the test waits


def live_children(client, experiment_name: str) -> list:
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return []
    return [run for run in client.search_runs([experiment.experiment_id]) if RUN_ID_TAG in run.data.tags]


def store_has_runs(path: Path) -> bool:
    """Read-only: the driver created the store and a run in it (opening a store with MLflow while
    another process creates it races on its schema)."""
    if not path.is_file():
        return False
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.Error:
        return False


@pytest.mark.slow
def test_a_child_run_is_running_with_training_steps_while_its_run_trains(tmp_path: Path):
    from mlflow import MlflowClient

    out = tmp_path / "out"
    spec = {
        "name": "live", "trainer": LONG_TRAINER, "factors": ["clip_higher"], "seeds": 1, "output_dir": str(out),
        "ledger": f"sqlite:///{out}/ledger.db", "tracking": {"uri": f"sqlite:///{out}/mlflow.db"},
        "executor": {"max_concurrent": 1, "cpus_per_run": 1, "lease_s": 600},
    }
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    driver = subprocess.Popen([COMMAND, "run", str(spec_path), "--no-progress"], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        client = seen = None
        deadline = time.time() + 600  # a safety net for a hung driver, not a time budget
        while seen is None:
            assert driver.poll() is None, f"the driver exited early: {driver.communicate()}"
            assert time.time() < deadline, "no live child with a training step"
            if client is None and store_has_runs(out / "mlflow.db"):  # its schema is complete
                client = MlflowClient(f"sqlite:///{out}/mlflow.db")
            if client is not None:
                for run in live_children(client, "live"):
                    steps = client.get_metric_history(run.info.run_id, "actor/entropy")
                    # status read after the history: RUNNING then means it was running with these steps
                    if steps and client.get_run(run.info.run_id).info.status == "RUNNING":
                        seen = run.info.run_id
            time.sleep(0.5)
        run = client.get_run(seen)
        assert "response_length/mean" in run.data.metrics and "val-core/builtin/acc/mean_at_4" in run.data.metrics
        assert run.data.tags[VERSION_TAG] and run.data.params["factor.clip_higher"] in ("0", "1")
        assert client.get_experiment_by_name("live").tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND
        parent = client.get_run(run.data.tags["mlflow.parentRunId"])
        assert "full design" in parent.data.tags["mlflow.note.content"] and parent.data.params["design"] == "full"
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=HANG_GUARD_S) == 143
        assert client.get_run(seen).info.status == "KILLED"  # continued by the next `run`
        assert len(live_children(client, "live")) == 1  # max_concurrent 1: the other never started
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
