"""Checks made before anything is written anywhere (`validate`, `run --dry-run`, and the start of
`run` and `sweep`): output and database folders where a file can really be created, database and
MLflow servers that answer within seconds, a reachable Ray address. Each failure is one sentence
naming the spec field and the fix."""

from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from dapo_ablate.ablation.store.errors import ExecutorError
from dapo_ablate.ablation.store.tracking import sqlite_path

if TYPE_CHECKING:
    from dapo_ablate.ablation.experiment.spec import ExperimentSpec


def preflight(spec: ExperimentSpec, address: str | None) -> None:
    """Refuse, before anything is written anywhere, an unwritable output or database folder, an
    unreachable ledger or MLflow server, or an unreachable Ray address (each check bounded to
    seconds)."""
    check_writable_folder(Path(spec.output_dir), "output_dir")
    for field_name, uri in (("ledger", spec.ledger), ("tracking.uri", spec.tracking.uri)):
        path = sqlite_path(uri)
        if path is not None:
            check_writable_folder(path.parent, field_name)
    check_database(spec.ledger, "ledger")
    check_tracking_store(spec.tracking.uri)
    if address:
        check_ray_address(address)


def check_writable_folder(folder: Path, field_name: str) -> None:
    """`folder` exists and is writable, or could be created: its nearest existing ancestor is a
    folder where a file can really be created (a probe file, removed at once: `os.access` says
    yes to root even on /proc)."""
    probe = folder.expanduser().absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ExecutorError(
            f"`{field_name}` folder {str(folder)!r} cannot be created because {str(probe)!r} is a file; choose another folder"
        )
    try:
        handle, name = tempfile.mkstemp(prefix=".dapo-write-test-", dir=probe)
        os.close(handle)
        os.unlink(name)
    except OSError as err:
        raise ExecutorError(
            f"`{field_name}` folder {str(folder)!r} is not writable ({str(probe)!r}: {err.strerror}); choose another folder"
        ) from None


def check_database(url: str, field_name: str, timeout_s: int = 5) -> None:
    """A database server named by `url` accepts a connection within seconds (SQLite files are
    checked as folders). Reads nothing, writes nothing."""
    if sqlite_path(url) is not None or not url.startswith(("postgresql", "mysql")):
        return
    from sqlalchemy import create_engine
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from dapo_ablate.ablation.store.database import with_psycopg_driver

    try:
        engine = create_engine(with_psycopg_driver(url), connect_args={"connect_timeout": timeout_s})
    except (ArgumentError, ImportError, ValueError) as err:
        raise ExecutorError(f"`{field_name}` {url!r} is not a usable database URL ({err}); fix `{field_name}`") from None
    try:
        with engine.connect():
            pass
    except DBAPIError as err:
        reason = (str(err.orig or err).strip().splitlines() or ["no answer"])[0]
        raise ExecutorError(
            f"could not connect to the {field_name} database at {url} ({reason}); start it or fix `{field_name}`"
        ) from None
    finally:
        engine.dispose()


def check_tracking_store(uri: str, timeout_s: float = 5.0) -> None:
    """The MLflow store answers within seconds: an HTTP tracking server's health endpoint, or a
    database server (an unreachable store used to be found only after minutes, once the ledger
    and Optuna study were written)."""
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
                pass
        except urllib.error.HTTPError:
            return  # it answers; a proxy may not route /health
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise ExecutorError(
                f"the MLflow tracking server at {uri} does not answer ({reason}); start it or fix tracking.uri"
            ) from None
    else:
        check_database(uri, "tracking.uri")


def check_ray_address(address: str, timeout_s: float = 5.0) -> None:
    """A TCP connect to ``host:port`` of a Ray address (``auto`` and ``local`` are left to Ray)."""
    if address in ("auto", "local"):
        return
    match = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", address.strip())
    if not match:
        raise ExecutorError(f"Ray address {address!r} is not host:port or ray://host:port; fix executor.address or --address")
    host, port = match.group(1), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ExecutorError(f"cannot reach the Ray cluster at {address} ({reason}); start it or fix executor.address / --address") from None
