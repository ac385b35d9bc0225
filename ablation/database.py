"""Database plumbing shared by the ledger, the MLflow tracker and the Optuna studies.

One place decides how a URL names its driver (plain ``postgresql://`` means psycopg 3, the driver
dapo-ablate installs) and how a SQLite engine behaves when several processes share the file.
"""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine

PSYCOPG_DRIVER = "postgresql+psycopg"
SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another process's write lock before giving up."""
POSTGRES_CONNECT_TIMEOUT_S = 10
WRITE_OPTION = "dapo_ledger_write"
"""Execution option marking a transaction that will write (SQLite then begins IMMEDIATE)."""


def with_psycopg_driver(url: str) -> str:
    """A plain ``postgresql://`` or ``postgres://`` URL as SQLAlchemy spells it for psycopg 3;
    any other URL unchanged."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return f"{PSYCOPG_DRIVER}://" + url[len(scheme):]
    return url


def make_engine(url: URL, json_serializer: Callable[[Any], str]) -> Engine:
    """An engine for the ledger: pre-pinged PostgreSQL connections with a connect timeout, or a
    SQLite file in WAL mode whose writers take the write lock when they begin."""
    if url.get_backend_name() == "postgresql":
        return create_engine(
            url,
            json_serializer=json_serializer,
            pool_pre_ping=True,
            connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S},
        )
    engine = create_engine(url, json_serializer=json_serializer)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # WAL: readers (`status`) never block the writer (`run`) and vice versa. The busy timeout
    # makes a second writer wait for the lock instead of failing with "database is locked".
    # isolation_level=None stops pysqlite from issuing its own (late, deferred) BEGIN;
    # _sqlite_on_begin issues ours.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_on_begin(connection: Any) -> None:
    # A deferred transaction that reads and then writes must upgrade its lock, and in WAL mode
    # that upgrade fails at once (SQLITE_BUSY) if another writer committed meanwhile: the busy
    # timeout does not help. Writers therefore take the write lock when they begin.
    immediate = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
