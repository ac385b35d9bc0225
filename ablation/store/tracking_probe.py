"""Before a tracking store is opened: is it there and does it answer, within seconds? MLflow's own
client retries an absent server, a silent one, one answering 5xx / 429, or a database it cannot
open for minutes before saying anything; `check_server_reachable` says it in one sentence at once
(`store.tracking.open_tracker`, `report`, `ui`, `run`, `sweep`, `train --tracking`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dapo_ablate.ablation.store.errors import ExecutorError


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for anything else)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):])


SERVER_PROBE_S = 3.0
"""How long a tracking server may take to accept a connection (MLflow's own client retries for minutes)."""


def check_server_reachable(uri: str, hint: str = "check tracking.uri", timeout_s: float = SERVER_PROBE_S) -> None:
    """The tracking store answers within seconds, or ExecutorError, one sentence ending in `hint`:
    an ``http(s)://`` server answers one request of MLflow's REST API with a status MLflow does not
    retry (a server that accepts the connection and then says nothing, or answers 5xx / 429, keeps
    MLflow's client retrying for minutes); a database server accepts a connection (`_check_database`);
    a SQLite file can be opened (`_check_sqlite`). MLflow itself retries a database it cannot open
    for about 100 s before saying anything. Any other URI is left to its store's own checks."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(uri)
    except ValueError as err:  # e.g. http://[::1 (an unclosed IPv6 address)
        raise ExecutorError(f"the MLflow tracking URI {uri!r} is not a URL ({err}); {hint}") from None
    if parts.scheme.split("+")[0] in ("postgresql", "postgres", "mysql"):
        return _check_database(uri, hint, timeout_s)
    if sqlite_path(uri) is not None:
        return _check_sqlite(uri, hint)
    if parts.scheme not in ("http", "https"):
        return
    try:
        status = _probe_status(parts, timeout_s)
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ExecutorError(f"the MLflow tracking server at {uri} does not answer within {timeout_s:g} s ({reason}); "
                            f"start it or {hint}") from None
    if status in _RETRIED_STATUSES:
        raise ExecutorError(f"the MLflow tracking server at {uri} answers HTTP {status} (MLflow would retry it for "
                            f"minutes); fix the server or {hint}")


def _check_database(uri: str, hint: str, timeout_s: float) -> None:
    """A PostgreSQL / MySQL tracking store's server accepts a connection within `timeout_s`."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    from dapo_ablate.ablation.store.database import with_psycopg_driver

    try:
        engine = create_engine(with_psycopg_driver(uri), connect_args={"connect_timeout": max(1, round(timeout_s))})
    except (SQLAlchemyError, ImportError, ValueError) as err:
        raise ExecutorError(f"the MLflow tracking URI {uri!r} is not a usable database URL ({err}); {hint}") from None
    try:
        with engine.connect():
            pass
    except (SQLAlchemyError, OSError) as err:
        reason = (str(getattr(err, "orig", None) or err).strip().splitlines() or ["no answer"])[0]
        raise ExecutorError(f"could not connect to the MLflow tracking database at {uri} ({reason}); start it or "
                            f"{hint}") from None
    finally:
        engine.dispose()


def _check_sqlite(uri: str, hint: str) -> None:
    """A SQLite tracking store's file can be opened (created, with its folder, as MLflow would):
    one that cannot (a folder under /proc, a read-only one, a folder at its name) is said now."""
    import sqlite3

    path = sqlite_path(uri)
    assert path is not None
    if str(path) in ("", ":memory:") or path.name == "":
        return  # an in-memory store: nothing to open
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        sqlite3.connect(path).close()
    except (OSError, sqlite3.Error) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ExecutorError(f"the MLflow tracking store file {str(path)!r} cannot be opened ({reason}); {hint}") from None


_RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
"""The HTTP statuses MLflow's client retries with growing pauses (its default: minutes in all)."""


def _probe_status(parts: Any, timeout_s: float) -> int:
    """The HTTP status of one GET of MLflow's experiment lookup at the server `parts` names, each
    socket operation bounded by `timeout_s` (OSError / ValueError when none comes). Direct, as
    MLflow's own connection is; TLS unverified here, MLflow verifies its own."""
    import http.client
    import ssl

    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == "https":
        connection: Any = http.client.HTTPSConnection(parts.hostname or "", port, timeout=timeout_s,
                                                      context=ssl._create_unverified_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", port, timeout=timeout_s)
    try:
        connection.request("GET", parts.path.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default")
        return connection.getresponse().status
    except http.client.HTTPException as err:  # a reply that is not HTTP
        raise ValueError(f"its reply is not HTTP: {type(err).__name__}") from None
    finally:
        connection.close()
