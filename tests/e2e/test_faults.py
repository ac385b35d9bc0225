"""Faults around a finished run and a hung run: nothing is trained twice, no slot hangs forever.
The database fails by injection (a real SQLite ledger whose finish() raises what a dropped
connection raises); the runs are real Ray tasks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from dapo_ablate.ablation.store import transient
from dapo_ablate.ablation.runtime.pool import KEPT_RESULT
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import LedgerError, SQLLedger

from support import calls, counting_cell, mlflow_children, rows, run, write_spec


real_finish = SQLLedger.finish


def dropped_connection() -> LedgerError:
    err = LedgerError("could not use the ledger database: server closed the connection unexpectedly")
    err.__cause__ = OperationalError("UPDATE runs", {}, Exception("server closed the connection unexpectedly"))
    return err


def sleeping_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """The CH-only cell hangs (sleeps far past any test's timeout); the others finish at once."""
    techniques = config["techniques"]
    if techniques["clip_higher"] and not techniques["overlong_filter"]:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "started").write_text("")
        time.sleep(3600)
    return counting_cell(config, run_dir, eval_cache_dir)


@pytest.fixture()
def quick_retries(monkeypatch):
    monkeypatch.setattr(transient, "TRANSIENT_RETRIES", (0.01, 0.01))


def test_a_ledger_write_that_fails_once_is_retried_and_the_run_is_not_retrained(local_ray, tmp_path, monkeypatch, quick_retries):
    failed = []

    def finish_failing_once(self, run_id, result):
        if not failed:
            failed.append(run_id)
            raise dropped_connection()
        return real_finish(self, run_id, result)

    monkeypatch.setattr(SQLLedger, "finish", finish_failing_once)
    spec, summary = run(write_spec(tmp_path), counting_cell)
    assert failed and summary.failed_attempts == 0
    assert set(calls(spec).values()) == {1}  # every run trained exactly once
    assert {row["status"] for row in rows(spec).values()} == {"done"}
    assert all(len(children) == 1 for children in mlflow_children(spec).values())
    assert not list((Path(spec.output_dir) / spec.name).glob(f"*/{KEPT_RESULT}"))


def test_a_ledger_that_stays_down_stops_the_driver_and_the_kept_result_is_recorded_next_time(
    local_ray, tmp_path, monkeypatch, quick_retries
):
    def finish_always_failing(self, run_id, result):
        raise dropped_connection()

    path = write_spec(tmp_path, executor={"max_concurrent": 1, "retries": 1})
    monkeypatch.setattr(SQLLedger, "finish", finish_always_failing)
    with pytest.raises(ExecutorError, match="this is the database, not the spec") as caught:
        run(path, counting_cell)
    assert KEPT_RESULT in str(caught.value)
    monkeypatch.setattr(SQLLedger, "finish", real_finish)
    spec, summary = run(path, counting_cell)
    assert {row["status"] for row in rows(spec).values()} == {"done"}
    assert set(calls(spec).values()) == {1}  # the kept result was recorded, not trained again
    assert all(len(children) == 1 for children in mlflow_children(spec).values())


def test_run_timeout_s_counts_from_the_runs_start_not_from_its_wait_for_a_ray_worker(local_ray, tmp_path):
    """Every run waits in Ray's queue, past its 2 s limit, while another task holds both CPUs: the
    limit counts from the run's start on a worker (a loaded machine's slow start is not the run's)."""
    import ray

    held = tmp_path / "held"

    @ray.remote(num_cpus=2)
    def hold_every_cpu(flag: str) -> None:
        Path(flag).write_text("")
        time.sleep(6)

    blocker = hold_every_cpu.remote(str(held))
    while not held.exists():  # the CPUs are held before any run is submitted
        assert not ray.wait([blocker], timeout=0.1)[0], ray.get(blocker)
    spec, summary = run(write_spec(tmp_path, executor={"run_timeout_s": 2, "retries": 0}), counting_cell)
    ray.get(blocker)
    assert summary.exit_code == 0 and not summary.failures
    assert {row["status"] for row in rows(spec).values()} == {"done"}


def test_a_run_past_run_timeout_s_is_failed_with_that_reason_and_the_experiment_ends(local_ray, tmp_path):
    path = write_spec(tmp_path, executor={"run_timeout_s": 3, "retries": 2})
    spec, summary = run(path, sleeping_cell)  # returns: the hung run did not hold its slot forever
    table = rows(spec)
    failed = [row for row in table.values() if row["status"] == "failed"]
    assert len(failed) == 1 and "run_timeout_s" in failed[0]["error"] and failed[0]["attempts"] == 1
    assert sum(row["status"] == "done" for row in table.values()) == 3
    assert summary.failures and "TimeoutError" in next(iter(summary.failures.values()))
