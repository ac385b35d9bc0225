"""The ledger's contract, one suite run on every backend: SQLite, PostgreSQL and memory (fixture
`backend_url`). What only a SQL database has (schema versions, URLs, SQLite files and locks, other
processes) is tested on SQLite and PostgreSQL alone (conftest's `ledger_url`), under "opening"."""

from __future__ import annotations

import inspect as python_inspect
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from sqlalchemy import create_engine, inspect, text

from dapo_ablate.ablation.experiment.identity import RunSpec
from dapo_ablate.ablation.store.ledger import (
    MEMORY_URL,
    SCHEMA_VERSION,
    Ledger,
    LedgerError,
    MemoryLedger,
    SQLLedger,
    connect_ledger,
)

FACTORS = (
    "overlong_filter", "clip_higher", "soft_overlong", "token_level_loss", "dynamic_sampling"
)


def make_runs(cells: range | list[int], seed: int = 0) -> list[RunSpec]:
    """Runs for cells given as integers 0..31 (bit i = factor i), ids unique per cell and seed."""
    runs = []
    for cell in cells:
        levels = {name: (cell >> i) & 1 for i, name in enumerate(FACTORS)}
        cell_key = "".join(str(level) for level in levels.values())
        runs.append(RunSpec(f"run-{cell_key}-s{seed}", cell_key, levels, seed, {"lr": 1e-6}))
    return runs


RESULT = {
    "metrics": {"avg@32": 0.5, "pass@32": 0.75},
    "eval_curve": [{"step": 0, "avg@32": 0.25}, {"step": 10, "avg@32": 0.5}],
    "signals": [{"step": 1, "entropy": 1.5, "kept_groups": 4}],
    "tokens_generated": 12_000,
    "tokens_discarded": 3_000,
    "wall_s": 42.5,
}


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres), "memory"])
def backend_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A URL of an empty ledger: a SQLite file, a fresh PostgreSQL database, then memory://."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    if request.param == "memory":
        return MEMORY_URL
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def ledger(backend_url: str) -> Iterator[Ledger]:
    with connect_ledger(backend_url) as opened:
        opened.ensure_experiment("exp", {"design": "full"})
        yield opened


@pytest.fixture
def another_handle(ledger: Ledger, backend_url: str) -> Callable[[], Ledger]:
    """Opens another handle on `ledger`'s store, as a second driver would: a SQL ledger with its
    own engine (its own connections); in memory the same object, which is all threads can share."""
    if backend_url == MEMORY_URL:
        return lambda: ledger
    return lambda: SQLLedger(backend_url)


def read_schema_versions(url: str) -> list[int]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            return list(connection.execute(text("SELECT version FROM schema_version")).scalars())
    finally:
        engine.dispose()


PROTOCOL_METHODS = {name for name in vars(Ledger) if not name.startswith("_")} | {
    "__enter__", "__exit__"
}


def test_the_protocol_lists_what_the_product_calls() -> None:
    assert set(Ledger.__annotations__) == {"url"}  # its one attribute
    assert PROTOCOL_METHODS == {
        "close", "__enter__", "__exit__", "ensure_experiment", "get_experiment",
        "set_mlflow_parent", "result_key", "add_runs", "claimable", "expired_leases", "claim",
        "heartbeat", "finish", "fail", "release", "reset_failed", "reopen_malformed",
        "set_mlflow_run", "set_job_id", "runs_table", "results", "record_look", "looks",
    }


@pytest.mark.parametrize("implementation", [SQLLedger, MemoryLedger])
def test_both_ledgers_implement_the_protocol_with_its_signatures(implementation: type) -> None:
    assert PROTOCOL_METHODS <= set(dir(implementation))
    for name in PROTOCOL_METHODS:
        expected = python_inspect.signature(getattr(Ledger, name)).parameters
        found = python_inspect.signature(getattr(implementation, name)).parameters
        assert [(p.name, p.kind, p.default) for p in found.values()] == [
            (p.name, p.kind, p.default) for p in expected.values()
        ], name


def test_connect_ledger_opens_sql_or_memory(tmp_path) -> None:
    with connect_ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as sql:
        assert type(sql) is SQLLedger and isinstance(sql, Ledger)
    memory = connect_ledger(MEMORY_URL)
    assert type(memory) is MemoryLedger and isinstance(memory, Ledger)
    assert memory.url == MEMORY_URL
    memory.ensure_experiment("exp", {})
    assert connect_ledger(MEMORY_URL).get_experiment("exp") is None  # each one is its own


def test_schema_version_is_recorded_once(ledger_url: str) -> None:
    SQLLedger(ledger_url).close()
    SQLLedger(ledger_url).close()
    assert read_schema_versions(ledger_url) == [SCHEMA_VERSION]


def test_newer_schema_is_refused(ledger_url: str) -> None:
    SQLLedger(ledger_url).close()
    engine = create_engine(ledger_url)
    with engine.begin() as connection:
        newer = {"v": SCHEMA_VERSION + 1}
        connection.execute(text("UPDATE schema_version SET version = :v"), newer)
    engine.dispose()
    with pytest.raises(LedgerError, match=rf"schema version {SCHEMA_VERSION + 1}, newer than"):
        SQLLedger(ledger_url)


def open_at_once(url: str, drivers: int = 6) -> list[Exception]:
    """Open the ledger at `url` from `drivers` threads released together; their errors."""
    barrier, errors = threading.Barrier(drivers), []

    def open_ledger() -> None:
        barrier.wait()
        try:
            SQLLedger(url).close()
        except Exception as err:  # collected: a thread's exception would otherwise vanish
            errors.append(err)

    threads = [threading.Thread(target=open_ledger) for _ in range(drivers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_drivers_opening_a_fresh_database_at_once_all_succeed(ledger_url: str) -> None:
    assert open_at_once(ledger_url) == []
    assert read_schema_versions(ledger_url) == [SCHEMA_VERSION]


def as_schema_1(url: str) -> None:
    """Turn a ledger into what schema 1 (dapo-ablate before Ray job ids) created: the same tables
    without ``runs.job_id`` (schema 2), ``experiments.digest`` / ``result_key`` (schema 3) and the
    ``looks`` table (schema 4), and version 1 recorded."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE runs DROP COLUMN job_id"))
            connection.execute(text("ALTER TABLE experiments DROP COLUMN digest"))
            connection.execute(text("ALTER TABLE experiments DROP COLUMN result_key"))
            connection.execute(text("DROP TABLE looks"))
            connection.execute(text("UPDATE schema_version SET version = 1"))
        with engine.connect() as connection:
            assert "job_id" not in {column["name"] for column in inspect(connection).get_columns("runs")}
    finally:
        engine.dispose()


def test_a_schema_1_ledger_is_upgraded_in_place_and_keeps_every_run(ledger_url: str) -> None:
    assert SCHEMA_VERSION == 4  # a newer schema needs its own upgrade test beside this one
    with SQLLedger(ledger_url) as ledger:
        ledger.ensure_experiment("exp", {"design": "full"}, digest="d1")
        runs = make_runs([0, 1, 2, 3])
        ledger.add_runs("exp", runs)
        ledger.claim(runs[0].run_id, "a:1")
        ledger.finish(runs[0].run_id, RESULT)
        ledger.set_mlflow_run(runs[0].run_id, "mlflow-0")
        ledger.claim(runs[1].run_id, "a:1")
        ledger.fail(runs[1].run_id, "RuntimeError: boom")
        ledger.claim(runs[2].run_id, "a:1")
        before = ledger.runs_table("exp")
        results_before = ledger.results("exp")
    as_schema_1(ledger_url)

    assert open_at_once(ledger_url) == []  # drivers racing to upgrade it: one does, none fails
    assert read_schema_versions(ledger_url) == [SCHEMA_VERSION]
    with SQLLedger(ledger_url) as ledger:
        assert ledger.runs_table("exp") == before  # job_id: None in both
        assert ledger.results("exp") == results_before
        ledger.set_job_id(runs[2].run_id, "dapo-ablate-exp-run-a1")
        assert ledger.heartbeat(runs[2].run_id, "a:1")
        assert ledger.get_experiment("exp").digest is None  # schema 1 had none: the next digest binds
        ledger.ensure_experiment("exp", {"design": "full"}, digest="d1")
        assert ledger.get_experiment("exp").digest == "d1" and len(ledger.result_key("exp")) == 32
        assert ledger.looks("exp") == [] and ledger.record_look("exp", 1, {"decided": 0})
    with SQLLedger(ledger_url) as ledger:  # opening an upgraded ledger again changes nothing
        job_ids = {row["run_id"]: row["job_id"] for row in ledger.runs_table("exp")}
        assert job_ids == {run.run_id: "dapo-ablate-exp-run-a1" if run == runs[2] else None for run in runs}


def test_unreachable_database_is_one_clear_sentence() -> None:
    with pytest.raises(LedgerError) as raised:
        SQLLedger("postgresql://postgres:hunter2@127.0.0.1:1/dapo")
    message = str(raised.value)
    masked = "postgresql+psycopg://postgres:***@127.0.0.1:1/dapo"
    assert message.startswith(f"could not connect to the ledger database at {masked}: ")
    assert message.endswith("; check `ledger:` in the spec")
    assert "hunter2" not in message and "\n" not in message


def test_unusable_urls_are_ledger_errors(tmp_path) -> None:
    (tmp_path / "a_file").write_text("")
    with pytest.raises(LedgerError, match="could not create the folder for the ledger database"):
        SQLLedger(f"sqlite:///{tmp_path / 'a_file' / 'ledger.db'}")
    with pytest.raises(LedgerError, match="unsupported ledger database"):
        SQLLedger("mysql://root@localhost/dapo")
    with pytest.raises(LedgerError, match="in-memory SQLite ledger"):
        SQLLedger("sqlite://")


@pytest.mark.postgres
def test_plain_postgresql_url_uses_psycopg(postgres_url: str) -> None:
    plain = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    with SQLLedger(plain) as ledger:
        assert ledger.url.startswith("postgresql+psycopg://")
        assert ledger.ensure_experiment("exp", {}) == 1


def test_sqlite_creates_its_folder_and_uses_wal(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    SQLLedger().close()  # the default URL is relative to the working directory
    path = tmp_path / "dapo-runs" / "ledger.db"
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_ensure_experiment_is_idempotent_and_updates_the_spec(ledger: Ledger) -> None:
    first = ledger.get_experiment("exp")
    assert ledger.ensure_experiment("exp", {"design": "fractional"}) == first.id
    record = ledger.get_experiment("exp")
    assert record.spec == {"design": "fractional"} and record.created_at == first.created_at
    assert ledger.get_experiment("absent") is None
    ledger.set_mlflow_parent("exp", "parent-123")
    assert ledger.get_experiment("exp").mlflow_parent_run_id == "parent-123"


def test_unknown_experiment_and_run_are_reported(ledger: Ledger) -> None:
    with pytest.raises(LedgerError, match="has no experiment named 'absent'"):
        ledger.counts("absent")
    with pytest.raises(KeyError, match="no run 'absent'"):
        ledger.claim("absent", "h:1")


def test_add_runs_is_idempotent(ledger: Ledger) -> None:
    runs = make_runs(range(4))
    assert ledger.add_runs("exp", runs) == 4
    assert ledger.add_runs("exp", runs) == 0
    assert ledger.add_runs("exp", runs + make_runs([4, 4])) == 1  # one new, listed twice
    assert ledger.counts("exp") == {"pending": 5, "running": 0, "done": 0, "failed": 0}
    assert ledger.claimable("exp") == sorted(run.run_id for run in make_runs(range(5)))


def test_two_experiments_share_a_run_and_its_result(ledger: Ledger) -> None:
    ledger.ensure_experiment("other", {})
    ledger.add_runs("exp", make_runs(range(0, 4)))
    assert ledger.add_runs("other", make_runs(range(2, 6))) == 2  # cells 2 and 3 are shared
    shared = make_runs([2])[0].run_id
    assert ledger.claim(shared, "h:1") and ledger.finish(shared, RESULT)
    assert shared not in ledger.claimable("other")
    assert [row["run_id"] for row in ledger.results("exp")] == [shared]
    assert ledger.results("other") == ledger.results("exp")
    assert ledger.counts("other") == {"pending": 3, "running": 0, "done": 1, "failed": 0}
    assert len(ledger.runs_table("exp")) == 4


def test_claim_is_exclusive(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs(range(2)))
    run_id = make_runs([0])[0].run_id
    assert ledger.claim(run_id, "a:1")
    assert not ledger.claim(run_id, "b:2")
    assert ledger.claimable("exp") == [make_runs([1])[0].run_id]
    row = ledger.runs_table("exp")[0]
    assert (row["status"], row["attempts"], row["host"]) == ("running", 1, "a:1")
    assert row["started_at"] is not None and row["heartbeat_at"] is not None


def test_racing_drivers_claim_each_run_exactly_once(
    ledger: Ledger, another_handle: Callable[[], Ledger]
) -> None:
    run_ids = [run.run_id for run in make_runs(range(20))]
    ledger.add_runs("exp", make_runs(range(20)))
    drivers = [another_handle() for _ in range(6)]
    barrier, wins, errors = threading.Barrier(len(drivers)), [], []

    def drive(number: int, driver: Ledger) -> None:
        barrier.wait()
        try:
            wins.extend(run_id for run_id in run_ids if driver.claim(run_id, f"host:{number}"))
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=drive, args=pair) for pair in enumerate(drivers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for driver in drivers:
        driver.close()
    assert errors == []
    assert sorted(wins) == sorted(run_ids)
    assert {row["attempts"] for row in ledger.runs_table("exp")} == {1}


def test_stale_lease_is_taken_over(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    assert ledger.claim(run_id, "a:1", lease_s=0.2)
    assert ledger.heartbeat(run_id, "a:1")
    assert not ledger.claim(run_id, "b:2", lease_s=30)
    time.sleep(0.3)
    assert ledger.claimable("exp", lease_s=0.2) == [run_id]
    assert ledger.claimable("exp", lease_s=30) == []
    # a crashed attempt still counts: its run is not claimable past max_attempts (it could be the
    # run that kills its drivers), only within them
    assert not ledger.claim(run_id, "b:2", lease_s=0.2, max_attempts=1)
    assert ledger.expired_leases("exp", lease_s=0.2) == [run_id]
    assert ledger.claim(run_id, "b:2", lease_s=0.2, max_attempts=2)
    row = ledger.runs_table("exp")[0]
    assert (row["status"], row["attempts"], row["host"]) == ("running", 2, "b:2")
    # The crashed holder has lost the run: its heartbeat, fail and release do nothing.
    assert not ledger.heartbeat(run_id, "a:1")
    assert not ledger.fail(run_id, "late", host="a:1")
    assert not ledger.release(run_id, host="a:1")
    assert ledger.heartbeat(run_id, "b:2")


def test_finish_happens_once(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    assert ledger.claim(run_id, "a:1")
    assert ledger.finish(run_id, RESULT)
    assert not ledger.finish(run_id, {**RESULT, "metrics": {"avg@32": 0.0}})
    assert not ledger.claim(run_id, "b:2", lease_s=0)
    assert not ledger.fail(run_id, "late")
    assert not ledger.release(run_id)
    [row] = ledger.results("exp")
    assert row["metrics"] == RESULT["metrics"]
    assert ledger.counts("exp")["done"] == 1
    assert ledger.runs_table("exp")[0]["finished_at"] is not None


def test_results_round_trip(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0b10110], seed=3))
    run_id = make_runs([0b10110], seed=3)[0].run_id
    ledger.claim(run_id, "a:1")
    ledger.set_mlflow_run(run_id, "child-7")
    metrics = {"avg@32": np.float32(0.375), "loss": float("nan"), "steps": np.int64(20)}
    assert ledger.finish(run_id, {**RESULT, "metrics": metrics})
    [row] = ledger.results("exp")
    assert row == {
        "run_id": run_id,
        "cell_key": "01101",
        "factors": {"overlong_filter": 0, "clip_higher": 1, "soft_overlong": 1,
                    "token_level_loss": 0, "dynamic_sampling": 1},
        "seed": 3,
        "metrics": {"avg@32": 0.375, "loss": None, "steps": 20},  # NaN is stored as null
        "eval_curve": RESULT["eval_curve"],
        "signals": RESULT["signals"],
        "tokens_generated": 12_000,
        "tokens_discarded": 3_000,
        "wall_s": 42.5,
        "mlflow_run_id": "child-7",
    }
    table_row = ledger.runs_table("exp")[0]
    assert table_row["wall_s"] == 42.5 and table_row["metrics"]["avg@32"] == 0.375


def test_malformed_result_writes_nothing(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    ledger.claim(run_id, "a:1")
    with pytest.raises(ValueError, match="needs `metrics`"):
        ledger.finish(run_id, {"wall_s": 1.0})
    with pytest.raises(ValueError, match="unknown result keys"):
        ledger.finish(run_id, {**RESULT, "avg32": 0.5})
    assert ledger.counts("exp")["running"] == 1 and ledger.results("exp") == []


def test_failures_are_retried_until_max_attempts(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    for attempt in (1, 2, 3):
        assert ledger.claimable("exp", max_attempts=3) == [run_id]
        assert ledger.claim(run_id, "a:1", max_attempts=3)
        assert ledger.fail(run_id, f"RuntimeError: boom {attempt}")
    assert ledger.claimable("exp", max_attempts=3) == []
    assert not ledger.claim(run_id, "a:1", max_attempts=3)
    assert ledger.claimable("exp", max_attempts=4) == [run_id]
    row = ledger.runs_table("exp")[0]
    assert (row["status"], row["attempts"], row["error"]) == ("failed", 3, "RuntimeError: boom 3")
    assert ledger.counts("exp")["failed"] == 1
    assert not ledger.fail(run_id, "not running")


def test_release_gives_the_attempt_back(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    assert not ledger.release(run_id)  # pending: nothing to release
    assert ledger.claim(run_id, "a:1")
    assert ledger.release(run_id, host="a:1")
    row = ledger.runs_table("exp")[0]
    assert (row["status"], row["attempts"], row["host"], row["started_at"]) == (
        "pending", 0, None, None,
    )
    assert ledger.claim(run_id, "b:2")
    assert ledger.runs_table("exp")[0]["attempts"] == 1


def test_a_job_id_is_kept_through_release_fail_and_finish(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    assert ledger.runs_table("exp")[0]["job_id"] is None
    ledger.set_job_id(run_id, "dapo-ablate-exp-run-a1")  # a pending run too: whatever its state
    assert ledger.claim(run_id, "a:1")
    assert ledger.release(run_id, host="a:1")  # Ctrl-C: the job keeps running, a rerun re-attaches
    assert ledger.runs_table("exp")[0]["job_id"] == "dapo-ablate-exp-run-a1"
    assert ledger.claim(run_id, "a:1")
    assert ledger.fail(run_id, "JobFailed: Ray job dapo-ablate-exp-run-a1 ended FAILED")
    assert ledger.runs_table("exp")[0]["job_id"] == "dapo-ablate-exp-run-a1"
    assert ledger.claim(run_id, "a:1")
    ledger.set_job_id(run_id, "dapo-ablate-exp-run-a2")
    assert ledger.finish(run_id, RESULT)
    row = ledger.runs_table("exp")[0]
    assert (row["status"], row["job_id"]) == ("done", "dapo-ablate-exp-run-a2")
    ledger.set_job_id(run_id, None)
    assert ledger.runs_table("exp")[0]["job_id"] is None
    with pytest.raises(KeyError, match="no run"):
        ledger.set_job_id("no-such-run", "job")


def test_unstorable_result_is_a_type_error_and_writes_nothing(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    ledger.claim(run_id, "a:1")
    with pytest.raises(TypeError, match="cannot store a object in the ledger"):
        ledger.finish(run_id, {**RESULT, "metrics": {"avg@32": object()}})
    assert ledger.runs_table("exp")[0]["status"] == "running" and ledger.results("exp") == []
    assert ledger.finish(run_id, RESULT)  # the run can still be finished


def test_reset_failed_gives_failed_runs_a_fresh_attempt_budget(ledger: Ledger) -> None:
    ledger.add_runs("exp", make_runs(range(3)))
    failed, done, pending = (run.run_id for run in make_runs(range(3)))
    for _ in range(2):
        assert ledger.claim(failed, "a:1", max_attempts=2) and ledger.fail(failed, "boom")
    assert ledger.claim(done, "a:1") and ledger.finish(done, RESULT)
    assert failed not in ledger.claimable("exp", max_attempts=2)
    assert ledger.reset_failed("exp", [failed, done, pending, "no-such-run"]) == 1
    rows = {row["run_id"]: row for row in ledger.runs_table("exp")}
    assert (rows[failed]["status"], rows[failed]["attempts"]) == ("failed", 0)
    assert rows[done]["status"] == "done" and rows[pending]["attempts"] == 0
    assert ledger.claimable("exp", max_attempts=2) == [failed, pending]


def test_what_a_ledger_returns_is_the_callers(ledger: Ledger) -> None:
    spec = {"design": "full", "seeds": [0, 1]}
    ledger.ensure_experiment("exp", spec)
    spec["seeds"].append(2)  # the caller's objects are not the stored ones, either way
    ledger.add_runs("exp", make_runs([0]))
    run_id = make_runs([0])[0].run_id
    ledger.claim(run_id, "a:1")
    ledger.finish(run_id, RESULT)
    ledger.get_experiment("exp").spec["seeds"].append(3)
    ledger.results("exp")[0]["metrics"]["avg@32"] = 0.0
    ledger.runs_table("exp")[0]["factors"]["clip_higher"] = 7
    assert ledger.get_experiment("exp").spec == {"design": "full", "seeds": [0, 1]}
    assert ledger.results("exp")[0]["metrics"] == RESULT["metrics"]
    assert ledger.runs_table("exp")[0]["factors"]["clip_higher"] == 0


def test_looks_are_stored_once_each_in_order_and_read_back(ledger: Ledger, another_handle) -> None:
    assert ledger.looks("exp") == []
    first = {"runs": 16, "decisions": {"OF": "supported", "CH": "undecided"}, "alpha_spent": 0.0012}
    assert ledger.record_look("exp", 1, first)
    other = another_handle()
    assert not other.record_look("exp", 1, {"runs": 16, "decisions": {}})  # a second driver looked too: the first stands
    assert other.record_look("exp", 2, {"runs": 32, "added": ["run-a", "run-b"]})
    looks = ledger.looks("exp")
    assert [look["number"] for look in looks] == [1, 2]
    assert {k: v for k, v in looks[0].items() if k not in ("number", "recorded_at")} == first
    assert looks[1]["added"] == ["run-a", "run-b"] and looks[0]["recorded_at"] <= looks[1]["recorded_at"]
    with pytest.raises(ValueError, match="look 4 of experiment 'exp' does not follow look 2"):
        ledger.record_look("exp", 4, {})
    with pytest.raises(LedgerError, match="no experiment named 'nope'"):
        ledger.looks("nope")
    ledger.ensure_experiment("other", {"design": "full"})
    assert ledger.looks("other") == []  # looks belong to their experiment
