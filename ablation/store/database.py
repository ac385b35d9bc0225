"""Database plumbing shared by the ledger, the MLflow tracker and the Optuna studies.

One place decides how a URL names its driver (plain ``postgresql://`` means psycopg 3, the driver
dapo-ablate installs) and how a SQLite engine behaves when several processes share the file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine

from dapo_ablate.core.atomic import open_lock

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


@contextmanager
def experiment_lock(ledger_url: str, name: str, timeout_s: float = 600.0) -> Iterator[None]:
    """Serialise the drivers of one experiment around work that is find-then-create: creating a
    new MLflow store's schema, and finding or creating the experiment's parent run. Two drivers
    share the ledger, so the lock lives there: an exclusive file lock beside a SQLite ledger, a
    session advisory lock on a PostgreSQL one (both released if the driver dies)."""
    from sqlalchemy.engine import make_url

    url = make_url(with_psycopg_driver(ledger_url))
    key = int.from_bytes(hashlib.sha256(f"dapo-ablate:{name}".encode()).digest()[:8], "big", signed=True)
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or ":memory:")
        if url.database in (None, "", ":memory:"):
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open_lock(f"{path}.lock")  # a link planted at its name is replaced, never followed
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"another driver of {name!r} held its lock for {timeout_s:.0f} s") from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        finally:
            os.close(handle)
        return
    if url.get_backend_name() != "postgresql":
        yield
        return
    engine = create_engine(url, connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                conn.commit()
    finally:
        engine.dispose()
