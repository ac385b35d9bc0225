"""Riding out database blips: a write to the ledger, MLflow's store or the Optuna study that fails
with a dropped or refused connection, a lock or a timeout is tried again with bounded backoff
before the driver gives up; then the message says which store failed, not that the spec is wrong.

Used by the run pool (`ablation.pool`), the factorial driver and the sweep driver for every write
they make while runs are in flight: claims, heartbeats, results, failures, releases, MLflow
children and events, Optuna tells and heartbeats. A store's calls go through one wrapper,
`Retrying` (``Retrying(ledger).claim(run_id, host, doing=f"claim {name}")``); `retry_transient` is
what it calls, and what a write spanning several calls goes through.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable

from dapo_ablate.ablation.store.ledger import LedgerError
from dapo_ablate.ablation.store.errors import ExecutorError

TRANSIENT_RETRIES = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds between the tries of one write (about 15 s in all before the driver gives up)."""

_TRANSIENT_TEXT = (
    "database is locked", "server closed the connection", "connection refused", "could not connect",
    "connection reset", "terminating connection", "timed out", "timeout", "connection was closed",
    "ssl syscall error", "broken pipe", "temporarily unavailable", "too many connections",
)
_PERMANENT_TEXT = ("no such table", "no such column", "syntax error", "does not exist", "permission denied for")

_STORE_MODULES = ("sqlalchemy", "psycopg", "sqlite3", "mlflow", "optuna", "requests", "urllib3", "dapo_ablate.ablation.store.ledger")
"""Where a store's errors come from; only their messages are read for the clues above."""
_HTTP_5XX = re.compile(r"\b(50[0-4]) (error|server|internal|bad gateway|service unavailable|gateway)|too many 5\d\d", re.I)

LEDGER = "the ledger database"
MLFLOW = "the MLflow tracking store"
OPTUNA = "the Optuna study's database"


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and the errors it was raised from or during (at most 8)."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_transient(err: BaseException) -> bool:
    """A store error worth retrying: a dropped or refused connection, a lock, a timeout, anywhere
    in the error's chain (SQLAlchemy's OperationalError, a connection the pool invalidated, an
    OS-level ConnectionError, an HTTP store's connection error or 5xx). Errors in the statement
    itself (a missing table, a syntax error) are not: retrying would only delay the message."""
    for cause in _chain(err):
        text = str(cause).lower()
        if any(part in text for part in _PERMANENT_TEXT):
            return False
        if getattr(cause, "connection_invalidated", False) or isinstance(cause, (ConnectionError, TimeoutError)):
            return True
        kind = type(cause)
        names = {klass.__name__ for klass in kind.__mro__}
        if "OperationalError" in names or "InterfaceError" in names:  # sqlalchemy / DBAPI (psycopg, sqlite3)
            return True
        module = kind.__module__
        if module.startswith(("requests", "urllib3")) and names & {"ConnectionError", "Timeout", "RetryError"}:
            return True  # (RetryError: an HTTP store that kept answering 5xx)
        if module.startswith(_STORE_MODULES) and (any(part in text for part in _TRANSIENT_TEXT) or _HTTP_5XX.search(text)):
            return True  # only a store's own error is read for clues: a user's value or path never is
    return False


def retry_transient(write: Callable[[], Any], doing: str, *, store: str = LEDGER, kept: Path | None = None) -> Any:
    """``write()``, tried again with bounded backoff (`TRANSIENT_RETRIES`) while its error is
    transient. When the store stays down, or a ledger error is not transient, an ExecutorError
    that says it is `store` (and where a finished result is kept), not the spec. Any other error
    is the caller's, raised as it is."""
    pauses = (*TRANSIENT_RETRIES, None)
    for pause in pauses:
        try:
            return write()
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:
            transient = is_transient(err)
            if transient and pause is not None:
                time.sleep(pause)
                continue
            if not transient and not isinstance(err, LedgerError):
                raise
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            where = f"; the result is kept in {kept} and is recorded by the next invocation" if kept else ""
            gave_up = f" after {len(pauses)} tries" if transient else ""
            fix = "free space on its disk" if _disk_full(err) else "check that it is up"
            raise ExecutorError(
                f"{store} failed while trying to {doing}{gave_up} ({first}){where}; this is the database, "
                f"not the spec: {fix}, then rerun"
            ) from err
    raise AssertionError("unreachable")  # the last pause is None: the loop returns or raises


class Retrying:
    """A store (the ledger, an MLflow tracker, an Optuna study or storage) whose every call is
    retried through the store's blips (`retry_transient`). Each call names what it does, in the
    words the user reads if the store stays down (``doing=``: "... failed while trying to
    {doing} ..."), and, for a finished result, where it is kept on disk (``kept=``)::

        Retrying(ledger).fail(run_id, error, host, doing=f"record the failure of {name}")
    """

    def __init__(self, target: Any, store: str = LEDGER) -> None:
        self._target, self._store = target, store

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._target, name)
        if not callable(method):
            raise AttributeError(f"{type(self._target).__name__}.{name} is not a call to retry")

        def call(*args: Any, doing: str, kept: Path | None = None, **kwargs: Any) -> Any:
            return retry_transient(lambda: method(*args, **kwargs), doing, store=self._store, kept=kept)

        return call


def _disk_full(err: BaseException) -> bool:
    """Whether `err` (or an error it was raised from) says the disk is full."""
    for _ in range(10):  # a chain of causes, never followed far
        if err is None:
            return False
        if getattr(err, "errno", None) == 28 or any(words in str(err).lower() for words in ("disk is full", "no space left")):
            return True
        err = err.__cause__ or err.__context__
    return False
