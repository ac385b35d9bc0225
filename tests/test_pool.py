"""The run pool shared by the factorial driver and the sweep (ablation/pool.py) and the transient
retries of every store write (ablation/transient.py): a blip in a claim or a heartbeat is ridden
out, a sweep's run past run_timeout_s fails its trial (stop signals: tests/test_stop_signals.py).
The database fails by injection (a real SQLite ledger whose methods raise what a dropped
connection raises); the runs are real Ray tasks."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError
from test_executor import calls, rows, run, write_spec
from test_faults import dropped_connection

from dapo_ablate.ablation.store import transient
from dapo_ablate.ablation.runtime.signals import Interrupted
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import LedgerError, SQLLedger
from dapo_ablate.ablation.experiment.spec import load_spec
from dapo_ablate.ablation.store.transient import is_transient, retry_transient


@pytest.fixture()
def quick_retries(monkeypatch):
    monkeypatch.setattr(transient, "TRANSIENT_RETRIES", (0.01, 0.01))


# -- what counts as transient ---------------------------------------------------------------------
def _raised_from(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize("err, expected", [
    (dropped_connection(), True),
    (OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked")), True),
    (_raised_from(RuntimeError("MLflow could not write"), ConnectionRefusedError(111, "Connection refused")), True),
    (TimeoutError("timed out"), True),
    (OperationalError("SELECT x", {}, sqlite3.OperationalError("no such table: runs")), False),
    (ProgrammingError("SELECT", {}, Exception("syntax error at or near")), False),
    (LedgerError("the ledger URL 'x' is not a database URL"), False),
    (ValueError("a value the ledger cannot store"), False),
])
def test_transient_errors_are_told_from_mistakes(err, expected):
    assert is_transient(err) is expected


def test_retry_rides_out_blips_and_then_blames_the_store_not_the_spec(quick_retries):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise dropped_connection()
        return "written"

    assert retry_transient(flaky, "write") == "written" and len(attempts) == 3

    def down():
        raise _raised_from(RuntimeError("write failed"), ConnectionRefusedError(111, "Connection refused"))

    with pytest.raises(ExecutorError, match=r"the MLflow tracking store failed while trying to log x after 3 tries.*not the spec"):
        retry_transient(down, "log x", store=transient.MLFLOW)
    with pytest.raises(ValueError):  # not the store's: raised as it is, at once
        retry_transient(lambda: (_ for _ in ()).throw(ValueError("bug")), "write")


# -- blips while runs are in flight ---------------------------------------------------------------
real_claim, real_heartbeat = SQLLedger.claim, SQLLedger.heartbeat


def counting_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """A trivial run that records each call in run_dir/calls (defined here: this module's
    functions travel to Ray's workers by value, test_faults' would be imported there)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(run_dir) / "calls", "a") as handle:
        handle.write(f"{time.time()}\n")
    return {"metrics": {"avg@32": 0.25 + 0.5 * config["techniques"]["clip_higher"]}, "wall_s": 0.1}


def beat_waiting_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """Finishes once the driver has renewed a lease (the heartbeat patch below drops a file
    next to the run folders), so that every run lives through at least one heartbeat."""
    beat = Path(run_dir).parent.parent / "beat"
    for _ in range(1200):  # a bound for a broken driver, not a timing assumption
        if beat.exists():
            break
        time.sleep(0.1)
    return counting_cell(config, run_dir, eval_cache_dir)


def test_a_blip_in_a_claim_or_a_heartbeat_is_ridden_out(local_ray, tmp_path, monkeypatch, quick_retries):
    failed: dict[str, int] = {"claim": 0, "heartbeat": 0}
    out = tmp_path / "out"

    def claim_failing_once(self, *args, **kwargs):
        if not failed["claim"]:
            failed["claim"] += 1
            raise dropped_connection()
        return real_claim(self, *args, **kwargs)

    def heartbeat_failing_once(self, run_id, host):
        if not failed["heartbeat"]:
            failed["heartbeat"] += 1
            raise dropped_connection()
        held = real_heartbeat(self, run_id, host)
        (out / "beat").write_text("")
        return held

    monkeypatch.setattr(SQLLedger, "claim", claim_failing_once)
    monkeypatch.setattr(SQLLedger, "heartbeat", heartbeat_failing_once)
    spec, summary = run(write_spec(tmp_path, executor={"retries": 0, "lease_s": 4}), beat_waiting_cell)
    assert failed == {"claim": 1, "heartbeat": 1}
    assert summary.exit_code == 0 and summary.failed_attempts == 0
    assert {row["status"] for row in rows(spec).values()} == {"done"}
    assert set(calls(spec).values()) == {1}  # nothing trained twice


def test_a_database_that_stays_down_during_heartbeats_stops_the_driver_with_a_sentence(local_ray, tmp_path, monkeypatch, quick_retries):
    def heartbeat_down(self, run_id, host):
        raise dropped_connection()

    def forever_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
        time.sleep(3600)
        return {}

    monkeypatch.setattr(SQLLedger, "heartbeat", heartbeat_down)
    with pytest.raises(ExecutorError, match="the ledger database failed while trying to renew the lease"):
        run(write_spec(tmp_path, executor={"retries": 0, "lease_s": 4, "max_concurrent": 1}), forever_cell)
    states = {row["status"] for row in rows(load_spec(tmp_path / "spec.yaml")).values()}
    assert "running" not in states  # the run in flight was given back on the way out


# -- the sweep runs on the same pool ---------------------------------------------------------------
def hanging_cell(config: dict, run_dir: str, eval_cache_dir: str, on_eval=None) -> dict:
    """Evaluates step 0, then hangs far past any test's timeout."""
    if on_eval is not None:
        on_eval(0, {"step": 0, "avg@4": 0.1})
    time.sleep(3600)
    return {}


def test_a_sweep_run_past_run_timeout_s_fails_its_trial_and_the_sweep_ends(local_ray, tmp_path):
    from test_sweep import sweep, trials, write_sweep

    path = write_sweep(tmp_path, n_trials=2, executor={"retries": 0, "max_concurrent": 2, "run_timeout_s": 3})
    spec, summary = sweep(path, hanging_cell)
    assert summary.exit_code == 1 and len(summary.failures) == 2
    assert all("exceeded executor.run_timeout_s (3 s)" in error for error in summary.failures.values())
    assert [t.state.name for t in trials(spec)] == ["FAIL", "FAIL"]
    ledger_rows = SQLLedger(spec.ledger).runs_table(spec.name)
    assert {row["status"] for row in ledger_rows} == {"failed"}
    assert all("run_timeout_s" in row["error"] for row in ledger_rows)


@pytest.mark.parametrize("command, target", [("run", "dapo_ablate.ablation.app.experiment.run_experiment"),
                                             ("sweep", "dapo_ablate.ablation.app.sweep.run_sweep")])
def test_the_cli_exits_143_with_a_sentence_when_stopped_before_the_driver_started(tmp_path, monkeypatch, command, target):
    from typer.testing import CliRunner

    from dapo_ablate.cli.main import app

    def stopped(*args, **kwargs):
        raise Interrupted(terminated=True)

    monkeypatch.setattr(target, stopped)
    if command == "run":
        path = write_spec(tmp_path)
    else:
        from test_sweep import write_sweep

        path = write_sweep(tmp_path)
    result = CliRunner().invoke(app, [command, str(path), "--no-progress"])
    assert result.exit_code == 143
    assert "interrupted before any run started; nothing was run or written" in result.output


def unstorable_cell(config: dict, run_dir: str, eval_cache_dir: str) -> dict:
    """The CH-only cell returns a result the ledger refuses (an unknown key whose name reads
    like a database clue); the others are fine."""
    result = counting_cell(config, run_dir, eval_cache_dir)
    techniques = config["techniques"]
    if techniques["clip_higher"] and not techniques["overlong_filter"]:
        result["timeouts"] = 3
    return result


def test_a_result_the_ledger_refuses_fails_its_run_and_blocks_no_later_run(local_ray, tmp_path, quick_retries):
    path = write_spec(tmp_path, executor={"retries": 0})
    spec, summary = run(path, unstorable_cell)  # not a database error: no retries, no driver stop
    assert summary.exit_code == 1 and len(summary.failures) == 1
    (error,) = summary.failures.values()
    assert "cannot be stored" in error and "database" not in error
    assert not list((tmp_path / "out" / spec.name).glob("*/finished-result.json"))
    spec, again = run(path, unstorable_cell)  # the next invocation starts normally
    assert again.already_done == 3
