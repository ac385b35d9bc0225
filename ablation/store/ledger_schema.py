"""The ledger's SQL schema over time: its recorded version, its creation on a new database, and
the in-place upgrade of an older dapo-ablate's ledger, one step per version (nothing is lost).
`SQLLedger` calls these inside its own transaction (`ablation.store.ledger`)."""

from __future__ import annotations

from sqlalchemy import Connection, func, inspect, select, text, update
from sqlalchemy.orm import Session

from dapo_ablate.ablation.store.ledger_database import refuse_foreign, table_names
from dapo_ablate.ablation.store.ledger_models import SCHEMA_VERSION, Base, SchemaVersion
from dapo_ablate.ablation.store.ledger_rules import LedgerError

POSTGRES_INIT_LOCK = 0x0DA90_1ED6E5
"""pg_advisory_xact_lock key serialising schema creation on PostgreSQL."""


def schema_version(session: Session, url: str) -> int | None:
    """The stored schema version (None for a new database); refuses a newer one."""
    if not inspect(session.connection()).has_table(SchemaVersion.__tablename__):
        return None
    found = session.scalar(select(SchemaVersion.version))
    if found is not None and found > SCHEMA_VERSION:
        raise LedgerError(
            f"the ledger database at {url} has schema version {found}, newer than "
            f"this dapo-ablate supports ({SCHEMA_VERSION}); upgrade dapo-ablate or "
            "point `ledger:` at another database"
        )
    return found


def create_or_upgrade(session: Session, url: str, *, serialise: bool) -> None:
    """In a write transaction: create the tables a new database lacks and record the version, or
    upgrade an older ledger step by step. ``serialise``: take PostgreSQL's advisory lock first, so
    that drivers starting together create the schema once."""
    if serialise:
        session.execute(select(func.pg_advisory_xact_lock(POSTGRES_INIT_LOCK)))
    refuse_foreign(url, table_names(session))  # (again: another process may have written)
    found = schema_version(session, url)
    Base.metadata.create_all(session.connection())
    if found is None:
        session.add(SchemaVersion(id=1, version=SCHEMA_VERSION))
    elif found < SCHEMA_VERSION:  # an older dapo-ablate's ledger: upgraded, nothing lost
        for version in range(found, SCHEMA_VERSION):
            UPGRADES[version](session.connection())
        session.execute(update(SchemaVersion).values(version=SCHEMA_VERSION))


def _add_job_id(connection: Connection) -> None:
    """Schema 1 -> 2: ``runs.job_id``. Idempotent (the column is added only where it is missing)."""
    if "job_id" not in {column["name"] for column in inspect(connection).get_columns("runs")}:
        connection.execute(text("ALTER TABLE runs ADD COLUMN job_id TEXT"))


def _add_experiment_binding(connection: Connection) -> None:
    """Schema 2 -> 3: ``experiments.digest`` and ``experiments.result_key``. Idempotent."""
    found = {column["name"] for column in inspect(connection).get_columns("experiments")}
    for column in ("digest", "result_key"):
        if column not in found:
            connection.execute(text(f"ALTER TABLE experiments ADD COLUMN {column} VARCHAR(64)"))


def _add_looks(connection: Connection) -> None:
    """Schema 3 -> 4: the ``looks`` table, which `create_all` has already made; nothing else changes."""


UPGRADES = {1: _add_job_id, 2: _add_experiment_binding, 3: _add_looks}
"""Schema version -> the step that upgrades a ledger from it to the next version, in place."""
