"""The ledger's tables (SQLAlchemy 2 ORM). The contract lives in `dapo_ablate.ablation.store.ledger`.

Bump `SCHEMA_VERSION` whenever a table or column changes, and teach `Ledger` to migrate the
previous version: a ledger records weeks of compute, so it is never silently recreated.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

SCHEMA_VERSION = 4
"""Version of the tables below, stored in `schema_version`; a newer database is refused.
1: the first release. 2: ``runs.job_id`` (a verl cell's Ray job). 3: ``experiments.digest`` (what
the name is bound to) and ``experiments.result_key`` (the key that seals kept results). 4: the
``looks`` table (an adaptive experiment's looks at its data)."""

LEDGER_TABLES = frozenset({"schema_version", "experiments", "runs", "experiment_runs", "results"})
"""The tables a database must hold to be a dapo-ablate ledger (every schema version has them)."""

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
RUN_STATUSES = (PENDING, RUNNING, DONE, FAILED)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    PostgreSQL keeps the zone (timestamptz); SQLite stores text without one, so we store naive
    UTC there and re-attach UTC on the way out. Lease comparisons then agree on both backends.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    """A single row: the version of the tables this database was created with."""

    __tablename__ = "schema_version"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class Experiment(Base):
    """One experiment spec (one YAML); its runs are linked through `experiment_runs`."""

    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    mlflow_parent_run_id: Mapped[str | None] = mapped_column(String(64))
    digest: Mapped[str | None] = mapped_column(String(64))
    """The digest of the spec's design the name is bound to (`store.binding`); None: not bound yet."""
    result_key: Mapped[str | None] = mapped_column(String(64))
    """Hex of the secret key that seals this experiment's kept results (`store.kept_results`),
    created once by the first driver that asks; None until then."""


class Run(Base):
    """One training run (cell x seed), keyed by the caller's content hash of its inputs.

    A run belongs to every experiment that needs it, so identical runs are trained once.
    """

    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(f"status IN {RUN_STATUSES!r}", name="runs_status_known"),
    )
    run_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    cell_key: Mapped[str] = mapped_column(String(64))
    factors: Mapped[dict[str, int]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(Text)
    """The submission id of the run's Ray job (a cell run as a job, `ablation.jobs`); kept when
    the run is released, finished or failed, so the job can be found (and stopped) afterwards."""


class ExperimentRun(Base):
    """Which experiments need which runs (many to many)."""

    __tablename__ = "experiment_runs"
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True, index=True
    )


class Result(Base):
    """What a finished run produced; written once, in the transaction that marks it done."""

    __tablename__ = "results"
    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
    )
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    eval_curve: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    signals: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    tokens_generated: Mapped[int] = mapped_column(BigInteger)
    tokens_discarded: Mapped[int] = mapped_column(BigInteger)
    wall_s: Mapped[float] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Look(Base):
    """One look of an adaptive experiment at its data: what was decided and what was added next,
    as the scheduler wrote it (`Ledger.record_look`). Written once per (experiment, number)."""

    __tablename__ = "looks"
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    record: Mapped[dict[str, Any]] = mapped_column(JSON)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)
