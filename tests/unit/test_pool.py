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
from dapo_ablate.ablation.store.transient import is_transient, retry_transient

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
