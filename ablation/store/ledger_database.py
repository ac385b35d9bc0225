"""Which database a ledger opens: its URL (SQLite file or PostgreSQL, psycopg 3), its SQLite file
inspected read-only before any engine touches it, and the rule that a database becomes a ledger only
if it is empty or already holds the ledger's tables (another application's is refused untouched)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session

from dapo_ablate.ablation.store import ledger_rules as rules
from dapo_ablate.ablation.store.database import PSYCOPG_DRIVER
from dapo_ablate.ablation.store.ledger_models import LEDGER_TABLES
from dapo_ablate.ablation.store.ledger_rules import LedgerError
from dapo_ablate.core.config_errors import not_a_file_error, not_a_file_mode


def resolve_url(url: str) -> URL:
    """Parse `url`; plain ``postgresql://`` (or ``postgres://``) uses the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except ArgumentError as err:
        raise LedgerError(f"the ledger URL {url!r} is not a database URL: {err}") from err
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername=PSYCOPG_DRIVER)
    backend = parsed.get_backend_name()
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise LedgerError(
            "an in-memory SQLite ledger would forget every run; give a file, "
            "e.g. sqlite:///dapo-runs/ledger.db"
        )
    if backend not in ("sqlite", "postgresql"):
        raise LedgerError(
            f"unsupported ledger database {parsed.render_as_string(hide_password=True)}; "
            "use sqlite:///path/to/ledger.db or postgresql://user@host/db"
        )
    return parsed


def make_parent_folder(url: URL, safe_url: str) -> None:
    database = url.database or ""
    if database.startswith("file:"):  # sqlite URI filenames: leave them to SQLite
        return
    try:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise LedgerError(
            f"could not create the folder for the ledger database at {safe_url}: "
            f"{err.strerror}; check `ledger:` in the spec"
        ) from err


def table_names(session: Session) -> set[str]:
    """The tables and views of the database's default schema (SQLite's own left out)."""
    found = inspect(session.connection())
    return {name for name in [*found.get_table_names(), *found.get_view_names()] if not name.startswith("sqlite_")}


def refuse_foreign(url: str, tables: set[str]) -> None:
    """A database may become a ledger if it is empty, and is one if it holds every ledger table;
    anything else is another application's: LedgerError, before anything is written."""
    if tables and not LEDGER_TABLES <= tables:
        raise rules.not_a_ledger(url, sorted(tables))


def check_sqlite_file(url: URL, safe_url: str) -> None:
    """An existing SQLite ledger file, inspected read-only before the engine opens it (the engine
    switches a database to WAL mode, a write): a special file, a file that is not SQLite or
    another application's database is refused with one sentence, unchanged."""
    database = url.database or ""
    if database.startswith("file:"):  # sqlite URI filenames: left to SQLite
        return
    path = Path(database)
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as err:
        raise LedgerError(f"the ledger database at {safe_url} {not_a_file_error(err, path, 'check `ledger:` in the spec')}") from None
    why = not_a_file_mode(info.st_mode)
    if why:
        raise LedgerError(f"the ledger database at {safe_url} {why}; point `ledger:` at a SQLite file")
    if info.st_size == 0:
        return
    query = "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite^_%' ESCAPE '^'"
    try:
        with closing(sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True, timeout=30)) as db:
            tables = {row[0] for row in db.execute(query)}
    except sqlite3.DatabaseError as err:
        raise LedgerError(
            f"could not connect to the ledger database at {safe_url}: {first_line(err)}; check `ledger:` in the spec"
        ) from None
    refuse_foreign(safe_url, tables)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0].strip().rstrip(".") if lines else type(error).__name__
