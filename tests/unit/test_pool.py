"""The run pool shared by the factorial driver and the sweep (ablation/pool.py) and the transient
retries of every store write (ablation/transient.py): a blip in a claim or a heartbeat is ridden
out, a sweep's run past run_timeout_s fails its trial (stop signals: tests/unit/test_stop_signals.py).
The database fails by injection (a real SQLite ledger whose methods raise what a dropped
connection raises); the runs are real Ray tasks.

The tests of this code that start Ray, `dapo-ablate` processes or training are in tests/e2e/test_pool_e2e.py."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError, ProgrammingError

from dapo_ablate.ablation.store import transient
from dapo_ablate.ablation.runtime.signals import Interrupted
from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.transient import Retrying, is_transient, retry_transient

from support import write_spec
from test_faults import dropped_connection


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


def test_the_retrying_ledger_rides_out_blips_and_names_what_each_call_did_when_it_stays_down(quick_retries, tmp_path):
    from dapo_ablate.ablation.experiment.identity import RunSpec
    from dapo_ablate.ablation.store.memory_ledger import MemoryLedger

    ledger, calls = MemoryLedger(), []
    ledger.ensure_experiment("exp", {})
    ledger.add_runs("exp", [RunSpec("r1", "1", {"a": 1}, 0, {})])
    real_heartbeat = ledger.heartbeat

    def blip_then_beat(run_id, host):
        calls.append(run_id)
        if len(calls) < 2:
            raise dropped_connection()
        return real_heartbeat(run_id, host)

    ledger.heartbeat = blip_then_beat
    stored = Retrying(ledger)
    assert stored.heartbeat("r1", "host", doing="renew the lease of cell-r1") is False and calls == ["r1", "r1"]

    def down(*args, **kwargs):
        raise dropped_connection()

    ledger.finish = down
    with pytest.raises(ExecutorError, match=r"^the ledger database failed while trying to record cell-r1 after 3 tries "
                                            r".*; the result is kept in .*kept.json and is recorded by the next invocation"):
        stored.finish("r1", {}, doing="record cell-r1", kept=tmp_path / "kept.json")
    with pytest.raises(TypeError):  # the words are not optional: a call without them is a bug, found at once
        stored.claim("r1", "host")


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
