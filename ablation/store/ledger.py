"""The run ledger: which runs each experiment needs, who is running them, and what they produced.

`Ledger` is a narrow storage interface (a `typing.Protocol`: what the drivers, the pool and the
reports call) with two implementations, one test suite run against both (tests/unit/test_ledger.py):
`SQLLedger` over one SQL database (SQLite by default, PostgreSQL for clusters), and `MemoryLedger`
(`ablation.store.memory_ledger`), which keeps it all in this process, as Optuna's InMemoryStorage
does. `connect_ledger(url)` opens either. Only the driver writes a ledger; any process may read a
SQL one (`dapo-ablate status`). The rules of the contract are stated once, in
`ablation.store.ledger_rules`, and both implementations apply them.

Contract
--------
Experiments and runs
    `ensure_experiment(name, spec, digest)` creates the experiment or replaces its spec
    (idempotent). With a `digest` (`store.binding`: what defines the experiment's runs, seeds
    aside) the name is bound to it: the first digest given is kept, and another one is refused
    (`LedgerError`, nothing written). `result_key(name)` is the experiment's secret key that seals
    the results a driver keeps on disk (`store.kept_results`), created once.
    `add_runs(name, runs)` records each `RunSpec` as *pending* unless a run with that `run_id`
    already exists, and links it to the experiment either way. `run_id` is the caller's content
    hash of everything that determines the result (factor levels, resolved trainer config, seed,
    package version), so two experiments that need the same run share one row and one result:
    nothing is trained twice. A run's spec is never updated; a changed input is a new `run_id`.

States
    ``pending --claim--> running --finish--> done``
    ``running --fail--> failed --claim--> running`` (while ``attempts < max_attempts``)
    ``running --release--> pending`` (Ctrl-C: the attempt is given back, not counted)
    ``running --claim--> running`` once its heartbeat is older than ``lease_s`` (a crashed
    driver's claim is taken over; the crashed attempt still counts), or is missing or more than
    ``lease_s`` ahead of now (a hand-edited row: no driver wrote it; `ledger_rules.LeaseWindow`).
    *done* is final: `finish` on a done run returns False and leaves the stored result as it was;
    `claim`, `fail` and `release` return False on it too. The one exception is a done run whose
    stored result is unusable (stored before `finish` checked it): reads show it failed and
    leave its result out, and `reopen_malformed(name)` puts it back to pending.

Ray jobs
    `set_job_id(run_id, job_id)` records the submission id of the Ray job a run's cell runs as
    (`dapo_ablate.ablation.runtime.jobs`). No state change clears it: after a release (Ctrl-C), a crash or
    a failure it still names the job a rerun re-attaches to, or the one a driver stops.

Concurrency
    `SQLLedger.claim` is a single ``UPDATE ... WHERE <claimable>`` whose row count says who won,
    so of any number of drivers (threads, processes, hosts) racing for a run exactly one gets
    True; `MemoryLedger` takes a lock instead (threads of one process).
    `finish` marks the run done and writes its result in one transaction. A holder should call
    `heartbeat` well within ``lease_s``; passing ``host`` to `heartbeat`, `fail` or `release`
    makes them act only while that host still holds the claim (use a host string that is unique
    per driver, e.g. ``"node3:4711"``). Leases compare the drivers' own UTC clocks: keep hosts
    NTP-synced and ``lease_s`` far above their skew.
    A ledger may be shared by threads; every method is one transaction.

Errors
    Problems a user fixes (bad URL, unreachable server, newer schema, unknown experiment, a name
    bound to another design, a database that is not a ledger) raise `LedgerError` with one
    sentence. An unknown ``run_id`` is a caller bug: `KeyError`. A result the ledger cannot hold
    is refused before anything is written: `ValueError` (unknown keys; metrics that are not a
    non-empty mapping of metric name -> number; curves that are not lists of mappings),
    `TypeError` (a value JSON cannot hold).

Whose database
    A ledger opens a database only if it is empty or already holds a ledger's tables; another
    application's database (or a file that is not SQLite) is refused with one sentence and left
    exactly as it was: a SQLite file is inspected read-only before anything else touches it.

Stored values
    JSON columns take dicts/lists of str, int, float, bool, None and numpy/torch scalars;
    NaN and infinities are stored as null (PostgreSQL's JSON has no NaN).
    Accuracy metrics are fractions in [0, 1] (docs/contracts.md, "The results table").
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session

from dapo_ablate.ablation.experiment.identity import RunSpec
from dapo_ablate.ablation.store import ledger_rules as rules
from dapo_ablate.ablation.store.database import WRITE_OPTION, make_engine
from dapo_ablate.ablation.store.ledger_database import (
    check_sqlite_file,
    first_line,
    make_parent_folder,
    refuse_foreign,
    resolve_url,
    table_names,
)
from dapo_ablate.ablation.store.ledger_models import (
    DONE,
    FAILED,
    PENDING,
    RUN_STATUSES,
    RUNNING,
    SCHEMA_VERSION,
    Experiment,
    Look,
    ExperimentRun,
    Result,
    Run,
)
from dapo_ablate.ablation.store.ledger_rules import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    ExperimentRecord,
    LedgerError,
)
from dapo_ablate.ablation.store.ledger_schema import create_or_upgrade, schema_version
from dapo_ablate.ablation.store.ledger_values import to_json
from dapo_ablate.ablation.store.memory_ledger import MEMORY_URL, MemoryLedger

__all__ = [
    "DEFAULT_LEASE_S",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_URL",
    "DONE",
    "FAILED",
    "MEMORY_URL",
    "PENDING",
    "RUNNING",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "ExperimentRecord",
    "Ledger",
    "LedgerError",
    "MemoryLedger",
    "SQLLedger",
    "check_ledger",
    "connect_ledger",
]

DEFAULT_URL = "sqlite:///dapo-runs/ledger.db"


@runtime_checkable
class Ledger(Protocol):
    """What the rest of dapo-ablate calls on a ledger (the contract: this module's docstring).

    Implemented by `SQLLedger` and `MemoryLedger`; open one with `connect_ledger`.
    """

    url: str
    """Where the ledger is, safe to print (a password is masked)."""

    def close(self) -> None: ...
    def __enter__(self) -> Ledger: ...
    def __exit__(self, *exc_info: object) -> None: ...

    def ensure_experiment(self, name: str, spec: dict[str, Any], digest: str | None = None) -> int: ...
    def get_experiment(self, name: str) -> ExperimentRecord | None: ...
    def set_mlflow_parent(self, name: str, mlflow_run_id: str) -> None: ...
    def result_key(self, name: str) -> bytes: ...

    def add_runs(self, name: str, runs: Sequence[RunSpec]) -> int: ...
    def claimable(self, name: str, *, lease_s: float = DEFAULT_LEASE_S,
                  max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> list[str]: ...
    def expired_leases(self, name: str, *, lease_s: float = DEFAULT_LEASE_S) -> list[str]: ...
    def claim(self, run_id: str, host: str, *, lease_s: float = DEFAULT_LEASE_S,
              max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> bool: ...
    def heartbeat(self, run_id: str, host: str | None = None) -> bool: ...
    def finish(self, run_id: str, result: dict[str, Any]) -> bool: ...
    def fail(self, run_id: str, error: str, host: str | None = None) -> bool: ...
    def release(self, run_id: str, host: str | None = None) -> bool: ...
    def reset_failed(self, name: str, run_ids: list[str]) -> int: ...
    def reopen_malformed(self, name: str) -> list[str]: ...
    def set_mlflow_run(self, run_id: str, mlflow_run_id: str) -> None: ...
    def set_job_id(self, run_id: str, job_id: str | None) -> None: ...

    def runs_table(self, name: str) -> list[dict[str, Any]]: ...
    def results(self, name: str) -> list[dict[str, Any]]: ...

    def record_look(self, name: str, number: int, record: dict[str, Any]) -> bool: ...
    def looks(self, name: str) -> list[dict[str, Any]]: ...


def connect_ledger(url: str) -> Ledger:
    """The ledger at `url`: a `SQLLedger` for a SQLAlchemy URL (``sqlite:///path``,
    ``postgresql://user@host/db``; its tables are created on first use), or a new, empty
    `MemoryLedger` for ``memory://`` (it lives as long as the object: every call is another one)."""
    if url == MEMORY_URL:
        return MemoryLedger()
    return SQLLedger(url)


def check_ledger(url: str) -> None:
    """Refuse, reading only, a ledger URL that `connect_ledger` would refuse without a server:
    an unusable URL, or an existing SQLite file that is special, not SQLite or another
    application's database (LedgerError, one sentence). Nothing is created or written: for
    `validate` and dry runs (a server's tables are checked when the ledger is opened)."""
    if url == MEMORY_URL:
        return
    parsed = resolve_url(url)
    if parsed.get_backend_name() == "sqlite":
        check_sqlite_file(parsed, parsed.render_as_string(hide_password=True))


class SQLLedger:
    """The ledger in the SQL database at ``url`` (see the module docstring for the contract).

    Opening it creates the tables on first use and records `SCHEMA_VERSION`; a database written
    by a newer dapo-ablate is refused rather than misread.
    """

    def __init__(self, url: str = DEFAULT_URL) -> None:
        self._url = resolve_url(url)
        self.url = self._url.render_as_string(hide_password=True)
        """The database URL with any password masked (safe to print)."""
        self._is_sqlite = self._url.get_backend_name() == "sqlite"
        if self._is_sqlite:
            make_parent_folder(self._url, self.url)
            check_sqlite_file(self._url, self.url)  # read-only, before the engine sets WAL mode
        self._engine = make_engine(self._url, json_serializer=to_json)
        self._write_engine = self._engine.execution_options(**{WRITE_OPTION: True})
        self._insert = sqlite_insert if self._is_sqlite else postgresql_insert
        try:
            self._open_schema()
        except BaseException:
            self._engine.dispose()
            raise

    def close(self) -> None:
        """Close pooled connections (the ledger can still be used; it reconnects)."""
        self._engine.dispose()

    def __enter__(self) -> SQLLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLLedger({self.url!r})"

    # -- experiments ---------------------------------------------------------------------------

    def ensure_experiment(self, name: str, spec: dict[str, Any], digest: str | None = None) -> int:
        """Create experiment `name` or replace its spec; return its id. With `digest`: bind the
        name to it (an unbound name takes it), or refuse another one (`LedgerError`, nothing
        written). One statement, so two drivers racing with different digests cannot both win."""
        stmt = self._insert(Experiment).values(name=name, spec=spec, created_at=rules.now(), digest=digest)
        stmt = stmt.on_conflict_do_update(
            index_elements=[Experiment.name],
            set_={"spec": stmt.excluded.spec, "digest": func.coalesce(Experiment.digest, stmt.excluded.digest)},
            where=or_(Experiment.digest.is_(None), Experiment.digest == stmt.excluded.digest, stmt.excluded.digest.is_(None)),
        ).returning(Experiment.id)
        with self._session(write=True) as session:
            experiment_id = session.execute(stmt).scalar()  # no row: the WHERE refused the update
            if experiment_id is None:
                found = session.scalar(select(Experiment.digest).where(Experiment.name == name))
                raise rules.other_design(self.url, name, found)
            return experiment_id

    def get_experiment(self, name: str) -> ExperimentRecord | None:
        """Experiment `name`'s row; LedgerError (one sentence naming it) when its recorded spec is
        not a JSON mapping: a row edited by hand, never one this ledger wrote."""
        try:
            with self._session() as session:
                row = session.scalar(select(Experiment).where(Experiment.name == name))
                if row is None:
                    return None
                record = ExperimentRecord(row.id, row.name, row.spec, row.created_at, row.mlflow_parent_run_id, row.digest)
        except (ValueError, StatementError) as err:  # the JSON column does not decode
            raise rules.unreadable_experiment(self.url, name, err) from None
        if not isinstance(record.spec, dict):
            raise rules.unreadable_experiment(self.url, name, TypeError(f"a {type(record.spec).__name__}, not a mapping"))
        return record

    def result_key(self, name: str) -> bytes:
        """The experiment's secret key for sealing kept results (32 bytes), created by the first
        caller; every later call, from any driver, gets the same key."""
        with self._session(write=True) as session:
            session.execute(
                update(Experiment)
                .where(Experiment.name == name, Experiment.result_key.is_(None))
                .values(result_key=secrets.token_hex(32))
            )
            key = session.scalar(select(Experiment.result_key).where(Experiment.name == name))
        if key is None:
            raise rules.no_experiment(self.url, name)
        return bytes.fromhex(key)

    def set_mlflow_parent(self, name: str, mlflow_run_id: str) -> None:
        with self._session(write=True) as session:
            experiment_id = self._experiment_id(session, name)
            session.execute(
                update(Experiment)
                .where(Experiment.id == experiment_id)
                .values(mlflow_parent_run_id=mlflow_run_id)
            )

    # -- runs ----------------------------------------------------------------------------------

    def add_runs(self, name: str, runs: Sequence[RunSpec]) -> int:
        """Record `runs` for experiment `name`; return how many were new to the ledger.

        Existing runs (same `run_id`, possibly added by another experiment) are only linked.
        """
        unique = rules.unique_runs(runs)
        now = rules.now()
        with self._session(write=True) as session:
            experiment_id = self._experiment_id(session, name)
            existing: set[str] = set()
            for chunk in _chunks([run.run_id for run in unique], 500):
                existing.update(session.scalars(select(Run.run_id).where(Run.run_id.in_(chunk))))
            new = [run for run in unique if run.run_id not in existing]
            if new:
                rows = [rules.new_run(run, now) for run in new]
                # DO NOTHING: another driver may insert the same run between our SELECT and here.
                session.execute(self._insert(Run.__table__).on_conflict_do_nothing(), rows)
            if unique:
                links = [{"experiment_id": experiment_id, "run_id": run.run_id} for run in unique]
                link = self._insert(ExperimentRun.__table__).on_conflict_do_nothing()
                session.execute(link, links)
        return len(new)

    def claimable(
        self,
        name: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> list[str]:
        """Run ids of `name` that `claim` would accept now, in (cell_key, seed) order."""
        cutoff = rules.lease_cutoff(rules.now(), lease_s)
        return self._run_ids_where(name, rules.claimable(Run, cutoff, max_attempts))

    def claim(
        self,
        run_id: str,
        host: str,
        *,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> bool:
        """Atomically take `run_id` for `host`; True for exactly one of any racing callers."""
        now = rules.now()
        claimable = rules.claimable(Run, rules.lease_cutoff(now, lease_s), max_attempts)
        stmt = (
            update(Run)
            .where(Run.run_id == run_id, claimable)
            .values(**rules.claimed(Run, host, now))
        )
        return self._transition(run_id, stmt)

    def heartbeat(self, run_id: str, host: str | None = None) -> bool:
        """Renew the lease; False if the run is no longer running (for `host`, if given)."""
        stmt = update(Run).where(_held(run_id, host)).values(**rules.renewed(rules.now()))
        return self._transition(run_id, stmt)

    def finish(self, run_id: str, result: dict[str, Any]) -> bool:
        """Mark `run_id` done and store `result`; False (and nothing written) if already done.

        `result` keys: ``metrics`` (dict, required), ``eval_curve`` (list of dicts, one per
        evaluation step), ``signals`` (list of per-step dicts), ``tokens_generated``,
        ``tokens_discarded``, ``wall_s``.
        """
        values = rules.stored_result(result)
        now = rules.now()
        stmt = (
            update(Run)
            .where(Run.run_id == run_id, rules.unfinished(Run))
            .values(**rules.finished(now))
        )
        with self._session(write=True) as session:
            if not self._won(session, run_id, stmt):
                return False
            session.add(Result(run_id=run_id, recorded_at=now, **values))
            return True

    def fail(self, run_id: str, error: str, host: str | None = None) -> bool:
        """Record a failed attempt of a running run with its error text."""
        stmt = update(Run).where(_held(run_id, host)).values(**rules.failed(error, rules.now()))
        return self._transition(run_id, stmt)

    def reset_failed(self, name: str, run_ids: list[str]) -> int:
        """Give the failed runs among `run_ids` of `name` a fresh attempt budget (`run
        --retry-failed`); how many."""
        stmt = (
            update(Run)
            .where(Run.run_id.in_(run_ids), rules.resettable(Run))
            .values(**rules.RESET)
        )
        with self._session(write=True) as session:
            return session.execute(stmt).rowcount or 0

    def reopen_malformed(self, name: str) -> list[str]:
        """Put the done runs of `name` whose stored result is unusable (`rules.malformed`: stored
        before `finish` checked results) back to pending with a fresh attempt budget, their
        results deleted; their run ids, in (cell_key, seed) order."""
        reopened = []
        with self._session(write=True) as session:
            query = (
                select(Run, Result)
                .join(ExperimentRun, ExperimentRun.run_id == Run.run_id)
                .outerjoin(Result, Result.run_id == Run.run_id)  # a done row without its result too
                .where(ExperimentRun.experiment_id == self._experiment_id(session, name), Run.status == DONE)
                .order_by(*_RUN_ORDER)
            )
            for run, result in session.execute(query).tuples().all():
                problem = rules.malformed(result)
                if problem is not None:
                    if result is not None:
                        session.delete(result)
                    for column, value in rules.reopened(problem).items():
                        setattr(run, column, value)
                    reopened.append(run.run_id)
        return reopened

    def expired_leases(self, name: str, *, lease_s: float = DEFAULT_LEASE_S) -> list[str]:
        """Run ids of `name` left running with a lease older than `lease_s` seconds."""
        cutoff = rules.lease_cutoff(rules.now(), lease_s)
        return self._run_ids_where(name, rules.lease_expired(Run, cutoff))

    def _run_ids_where(self, name: str, condition: ColumnElement[bool]) -> list[str]:
        """Run ids of experiment `name` meeting `condition`, in (cell_key, seed) order."""
        with self._session() as session:
            experiment_id = self._experiment_id(session, name)
            query = (
                select(Run.run_id)
                .join(ExperimentRun, ExperimentRun.run_id == Run.run_id)
                .where(ExperimentRun.experiment_id == experiment_id, condition)
                .order_by(*_RUN_ORDER)
            )
            return list(session.scalars(query))

    def release(self, run_id: str, host: str | None = None) -> bool:
        """Put a running run back to pending and give its attempt back (used on Ctrl-C)."""
        stmt = update(Run).where(_held(run_id, host)).values(**rules.released(Run))
        return self._transition(run_id, stmt)

    def set_mlflow_run(self, run_id: str, mlflow_run_id: str) -> None:
        stmt = update(Run).where(Run.run_id == run_id).values(mlflow_run_id=mlflow_run_id)
        self._transition(run_id, stmt)

    def set_job_id(self, run_id: str, job_id: str | None) -> None:
        """Record the Ray job `run_id` runs as (None forgets it), whatever the run's state."""
        self._transition(run_id, update(Run).where(Run.run_id == run_id).values(job_id=job_id))

    # -- reading -------------------------------------------------------------------------------

    def counts(self, name: str) -> dict[str, int]:
        """Status -> number of runs of `name` (every status present, zeros included)."""
        with self._session() as session:
            query = (
                select(Run.status, func.count())
                .join(ExperimentRun, ExperimentRun.run_id == Run.run_id)
                .where(ExperimentRun.experiment_id == self._experiment_id(session, name))
                .group_by(Run.status)
            )
            found = dict(session.execute(query).tuples().all())
        return rules.count_by_status(found)

    def runs_table(self, name: str) -> list[dict[str, Any]]:
        """One dict per run of `name`, in (cell_key, seed) order: what `status` prints.

        Keys: run_id, cell_key, factors, seed, status, attempts, error, host, created_at,
        started_at, finished_at, heartbeat_at, wall_s and metrics (None until done),
        mlflow_run_id, job_id (the Ray job's submission id, None for a cell run as a task).
        """
        rows = self._runs_with_results(name, done_only=False)
        return [rules.runs_table_row(run, result) for run, result in rows]

    def results(self, name: str) -> list[dict[str, Any]]:
        """One dict per done run of `name`, in (cell_key, seed) order: what reports consume.

        Keys: run_id, cell_key, factors, seed, metrics, eval_curve, signals, tokens_generated,
        tokens_discarded, wall_s, mlflow_run_id.
        """
        rows = self._runs_with_results(name, done_only=True)
        return [rules.results_row(run, result) for run, result in rows if rules.usable(result)]

    # -- an adaptive experiment's looks ---------------------------------------------------------

    def record_look(self, name: str, number: int, record: dict[str, Any]) -> bool:
        """Store look `number` (1, 2, ...) of experiment `name` once: True if this call stored it,
        False if it was already there (another driver looked first; its record stands). A look
        must follow the last one stored (`ValueError` otherwise)."""
        values = {"number": number, "record": rules.look_record(record), "recorded_at": rules.now()}
        with self._session(write=True) as session:
            experiment_id = self._experiment_id(session, name)
            last = session.scalar(select(func.max(Look.number)).where(Look.experiment_id == experiment_id)) or 0
            rules.check_look_number(name, number, last)
            stmt = self._insert(Look.__table__).values(experiment_id=experiment_id, **values)
            return session.execute(stmt.on_conflict_do_nothing().returning(Look.number)).scalar() is not None

    def looks(self, name: str) -> list[dict[str, Any]]:
        """The experiment's looks in order: ``{"number", "recorded_at", **record}`` each."""
        with self._session() as session:
            experiment_id = self._experiment_id(session, name)
            rows = session.execute(select(Look.number, Look.recorded_at).where(Look.experiment_id == experiment_id)
                                   .order_by(Look.number)).all()
            return [rules.look_row(number, at, self._look_record(session, name, experiment_id, number), name, self.url)
                    for number, at in rows]

    def _look_record(self, session: Session, name: str, experiment_id: int, number: int) -> Any:
        """One look's record, read alone so that one that does not decode (edited by hand) is named."""
        try:
            return session.scalar(select(Look.record).where(Look.experiment_id == experiment_id, Look.number == number))
        except (ValueError, StatementError) as err:
            raise rules.unreadable_look(self.url, name, number, str(err).splitlines()[0] or "not JSON") from None

    # -- internals -----------------------------------------------------------------------------

    @contextmanager
    def _session(self, write: bool = False, doing: str = "use") -> Iterator[Session]:
        """The one way in: a transaction that commits, rolls back on error and translates
        driver errors into `LedgerError`. `write` takes SQLite's write lock up front."""
        try:
            engine = self._write_engine if write else self._engine
            with Session(engine, expire_on_commit=False) as session, session.begin():
                yield session
        except DBAPIError as err:
            reason = first_line(err.orig if err.orig is not None else err)
            hint = "; check `ledger:` in the spec" if doing == "connect to" else ""
            raise LedgerError(
                f"could not {doing} the ledger database at {self.url}: {reason}{hint}"
            ) from err

    def _open_schema(self) -> None:
        # Opening an up-to-date ledger only reads, so `status` never waits for `run`'s writes.
        with self._session(doing="connect to") as session:
            refuse_foreign(self.url, table_names(session))
            if schema_version(session, self.url) == SCHEMA_VERSION:
                return
        with self._session(write=True, doing="connect to") as session:
            create_or_upgrade(session, self.url, serialise=not self._is_sqlite)  # SQLite's BEGIN IMMEDIATE serialises

    def _experiment_id(self, session: Session, name: str) -> int:
        experiment_id = session.scalar(select(Experiment.id).where(Experiment.name == name))
        if experiment_id is None:
            raise rules.no_experiment(self.url, name)
        return experiment_id

    def _transition(self, run_id: str, stmt: Any) -> bool:
        with self._session(write=True) as session:
            return self._won(session, run_id, stmt)

    @staticmethod
    def _won(session: Session, run_id: str, stmt: Any) -> bool:
        """Execute a guarded UPDATE of one run; True if it matched. Unknown run -> KeyError."""
        if session.execute(stmt.execution_options(synchronize_session=False)).rowcount == 1:
            return True
        if session.get(Run, run_id) is None:
            raise rules.no_run(run_id)
        return False

    def _runs_with_results(
        self, name: str, done_only: bool
    ) -> list[tuple[Run, Result | None]]:
        with self._session() as session:
            query = (
                select(Run, Result)
                .join(ExperimentRun, ExperimentRun.run_id == Run.run_id)
                .join(Result, Result.run_id == Run.run_id, isouter=not done_only)
                .where(ExperimentRun.experiment_id == self._experiment_id(session, name))
                .order_by(*_RUN_ORDER)
            )
            return list(session.execute(query).tuples())


_RUN_ORDER = [getattr(Run, column) for column in rules.RUN_ORDER]


def _held(run_id: str, host: str | None) -> ColumnElement[bool]:
    return and_(Run.run_id == run_id, rules.held(Run, host))


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
